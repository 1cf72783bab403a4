#include "runtime/stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <iterator>

#include "core/error.h"

namespace trainer {
namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
volatile std::sig_atomic_t g_received = 0;
struct sigaction g_previous[sizeof(kStopSignals) / sizeof(int)];

extern "C" void on_stop_signal(int sig) {
  if (sig == SIGINT && g_received == SIGINT) _exit(128 + SIGINT);  // Ctrl-C twice: now
  if (g_received == 0) g_received = sig;
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // file and socket calls in progress carry on
  for (size_t i = 0; i < std::size(kStopSignals); ++i)
    if (sigaction(kStopSignals[i], &sa, &g_previous[i]) != 0)
      runtime_error("cannot install the handler of signal {}", kStopSignals[i]);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < std::size(kStopSignals); ++i)
    sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

int StopSignals::received() const { return g_received; }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
  }
  return "signal " + std::to_string(sig);
}

}  // namespace trainer
