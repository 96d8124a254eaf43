#include "common/descriptors.h"

#include <dirent.h>
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

namespace {

// Open descriptors of this process, or -1 when they cannot be counted (listing
// /proc needs a descriptor too).
long count_open() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  long n = 0;
  while (readdir(d)) ++n;
  closedir(d);
  return n - 3;  // ".", ".." and the listing's own descriptor
}

}  // namespace

std::string out_of_descriptors_message(const std::string& doing) {
  std::string limit = "unknown";
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) == 0)
    limit = l.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(l.rlim_cur);
  const long open = count_open();
  return "out of file descriptors (RLIMIT_NOFILE=" + limit + (open >= 0 ? ", " + std::to_string(open) + " open" : "") +
         ") while " + doing + "; raise the limit (ulimit -n) or open fewer files and sockets";
}

}  // namespace bagua
