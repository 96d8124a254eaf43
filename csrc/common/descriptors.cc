#include "common/descriptors.h"

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

namespace bagua {

bool out_of_descriptors() {
  int fd = eventfd(0, EFD_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return false;
  }
  return errno == EMFILE || errno == ENFILE;
}

std::string out_of_descriptors_message(const std::string& doing) {
  std::string limit = "unknown";
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) == 0) limit = l.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(l.rlim_cur);
  return "out of file descriptors (RLIMIT_NOFILE=" + limit + ") while " + doing +
         "; raise the limit (ulimit -n) or open fewer files and sockets";
}

}  // namespace bagua
