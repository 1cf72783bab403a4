#include "runtime/csv.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace trainer {

namespace {

// The check itself; the caller holds a lock on the file (or the file does not exist).
void check_header_locked(const std::string& path, const std::string& header) {
  std::ifstream in(path);
  std::string first;
  if (in && std::getline(in, first) && !first.empty() && first != header)
    usage_error("--csv {}: the file has other columns (written by another version); use a new file",
                path);
}

}  // namespace

void check_csv_header(const std::string& path, const std::string& header) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    usage_error("--csv {}: not a regular file", path);
  // A shared lock: another run may be appending the file's first row (header included) right
  // now, and a read during that write could see half a header.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // no file yet: nothing to check
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // also releases the lock
  } closer{fd};
  if (::flock(fd, LOCK_SH) != 0)
    usage_error("--csv {}: cannot lock the file ({})", path, std::strerror(errno));
  check_header_locked(path, header);
}

void append_csv_row(const std::string& path, const std::string& header, const std::string& row) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) usage_error("--csv {}: cannot open for appending ({})", path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // also releases the lock
  } closer{fd};
  if (::flock(fd, LOCK_EX) != 0)
    usage_error("--csv {}: cannot lock the file ({})", path, std::strerror(errno));
  check_header_locked(path, header);  // under the lock: another run may have just written it
  struct stat st {};
  const bool fresh = ::fstat(fd, &st) == 0 && st.st_size == 0;
  const std::string bytes = (fresh ? header + "\n" : std::string()) + row;
  if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()))
    usage_error("--csv {}: cannot append the row ({})", path, std::strerror(errno));
}

std::string nccl_env_field() {
  std::string env;
  for (const char* name :
       {"NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_CTA_POLICY", "NCCL_PROTO", "NCCL_ALGO",
        "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
        "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME"})
    if (const char* v = std::getenv(name))
      env += fmt::format("{}{}={}", env.empty() ? "" : " ", name, v);
  return env.find(',') == std::string::npos ? env : '"' + env + '"';
}

}  // namespace trainer
