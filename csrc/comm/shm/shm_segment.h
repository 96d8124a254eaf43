// A POSIX shared-memory segment mapped into this process.
//
// create() makes a new segment (O_EXCL, mode 0600) and reserves its pages with
// posix_fallocate, so a full /dev/shm is an error here and never a SIGBUS at
// first touch; open() maps an existing one of the same size. unlink() removes
// the name (the mapping stays valid); the creator calls it as soon as every
// process has mapped the segment, so nothing is left in /dev/shm after a crash
// past that point. Errors throw bagua::Error with the reason.
#pragma once

#include <cstddef>
#include <string>

namespace bagua {

class ShmSegment {
 public:
  static ShmSegment create(const std::string& name, size_t bytes);
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&&) = delete;
  ShmSegment(const ShmSegment&) = delete;
  ~ShmSegment();

  void unlink();  // idempotent; only the creator calls it
  void* data() const { return base_; }
  size_t size() const { return bytes_; }

 private:
  ShmSegment(std::string name, void* base, size_t bytes, bool owner)
      : name_(std::move(name)), base_(base), bytes_(bytes), owner_(owner) {}

  std::string name_;
  void* base_;
  size_t bytes_;
  bool owner_;  // still has a name to unlink
};

}  // namespace bagua
