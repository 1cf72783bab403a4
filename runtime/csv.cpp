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

// An open descriptor of the CSV holding a flock (`how`: LOCK_SH or LOCK_EX); closing it releases
// the lock. fd < 0 when the open failed (errno says why).
struct LockedFile {
  int fd;
  LockedFile(const std::string& path, int flags, int how)
      : fd(::open(path.c_str(), flags | O_CLOEXEC, 0644)) {
    if (fd >= 0 && ::flock(fd, how) != 0) {
      const int err = errno;
      ::close(fd);  // the destructor does not run when the constructor throws
      usage_error("--csv {}: cannot lock the file ({})", path, std::strerror(err));
    }
  }
  ~LockedFile() {
    if (fd >= 0) ::close(fd);
  }
  LockedFile(const LockedFile&) = delete;
  LockedFile& operator=(const LockedFile&) = delete;
};

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
  const LockedFile file(path, O_RDONLY, LOCK_SH);
  if (file.fd < 0) return;  // no file yet: nothing to check
  check_header_locked(path, header);
}

void append_csv_row(const std::string& path, const std::string& header, const std::string& row) {
  const LockedFile file(path, O_WRONLY | O_APPEND | O_CREAT, LOCK_EX);
  if (file.fd < 0)
    usage_error("--csv {}: cannot open for appending ({})", path, std::strerror(errno));
  check_header_locked(path, header);  // under the lock: another run may have just written it
  struct stat st {};
  const bool fresh = ::fstat(file.fd, &st) == 0 && st.st_size == 0;
  const std::string bytes = (fresh ? header + "\n" : std::string()) + row;
  if (::write(file.fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()))
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
