// Scratch files for tests that read and write real files: a temporary directory removed at scope
// exit, whole-file byte helpers, and opening a FIFO without hanging the test.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>

#include "core/error.h"
#include "tests/catch.h"

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at scope exit.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "trainer_test") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/" + prefix + ".XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs `open_it` on the FIFO `fifo` and returns the UsageError message it throws ("" if none).
// A fixed open does not wait for a writer. If a regression makes it block, a watchdog connects a
// writer after 5 s, which releases it, and the test fails on `released` instead of hanging.
inline std::string open_fifo_without_waiting(const std::string& fifo,
                                             const std::function<void()>& open_it) {
  std::atomic<bool> returned{false}, released{false};
  std::thread watchdog([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!returned) {
      if (std::chrono::steady_clock::now() >= deadline) {
        // Fails (ENXIO) until a reader has the FIFO open, i.e. is blocked in open(2).
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) {
          released = true;
          ::close(fd);
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::string message;
  try {
    open_it();
  } catch (const trainer::UsageError& e) {
    message = e.what();
  } catch (...) {
    returned = true;
    watchdog.join();
    throw;
  }
  returned = true;
  watchdog.join();
  CHECK_FALSE(released);  // true: the open blocked until the watchdog's writer came
  return message;
}

// `open` refuses the FIFO `fifo` (created here) and the character devices /dev/zero and /dev/null
// at once, each with "<label> '<path>' is not a regular file (a FIFO | a character device)".
inline void check_special_files_refused(const std::string& fifo, const std::string& label,
                                        const std::function<void(const std::string&)>& open) {
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const std::string message = open_fifo_without_waiting(fifo, [&] { open(fifo); });
  INFO(message);
  CHECK(message == label + " '" + fifo + "' is not a regular file (a FIFO)");
  for (const char* dev : {"/dev/zero", "/dev/null"}) {
    if (!std::filesystem::exists(dev)) continue;
    REQUIRE_THROWS_WITH(
        open(dev),
        ContainsSubstring(label + " '" + dev + "' is not a regular file (a character device)"));
  }
}
