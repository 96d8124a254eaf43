#include "comm/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace bagua {
namespace {

std::string sys_error(const std::string& what, const std::string& name, int err) {
  return "shared memory segment " + name + ": " + what + ": " + std::strerror(err);
}

// Closes the descriptor when the mapping is made (or on an error).
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void* map(int fd, const std::string& name, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw Error(sys_error("mmap", name, errno));
  return p;
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  Fd f{::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)};
  if (f.fd < 0) throw Error(sys_error("shm_open", name, errno));
  int err = ::ftruncate(f.fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  // posix_fallocate returns the error instead of setting errno.
  if (err == 0) err = ::posix_fallocate(f.fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    ::shm_unlink(name.c_str());
    throw Error(sys_error("reserving " + std::to_string(bytes) + " bytes (is /dev/shm full?)", name, err));
  }
  try {
    return ShmSegment(name, map(f.fd, name, bytes), bytes, true);
  } catch (...) {
    ::shm_unlink(name.c_str());
    throw;
  }
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  Fd f{::shm_open(name.c_str(), O_RDWR, 0600)};
  if (f.fd < 0) throw Error(sys_error("shm_open", name, errno));
  struct stat st;
  if (::fstat(f.fd, &st) != 0) throw Error(sys_error("fstat", name, errno));
  if (static_cast<size_t>(st.st_size) != bytes)
    throw Error("shared memory segment " + name + " has " + std::to_string(st.st_size) + " bytes, expected " +
                std::to_string(bytes));
  return ShmSegment(name, map(f.fd, name, bytes), bytes, false);
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : name_(std::move(o.name_)), base_(o.base_), bytes_(o.bytes_), owner_(o.owner_) {
  o.base_ = nullptr;
  o.owner_ = false;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (base_) ::munmap(base_, bytes_);
}

void ShmSegment::unlink() {
  if (!owner_) return;
  owner_ = false;
  ::shm_unlink(name_.c_str());
}

}  // namespace bagua
