// Exception types raised by the engine. The bindings map each to a Python class
// (see bagua_core/errors.py), so callers can tell a timeout from a dead peer.
#pragma once

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace bagua {

// Base of every engine error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A blocking call did not complete within its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer process went away (connection closed or reset) during an operation.
class PeerError : public Error {
 public:
  PeerError(const std::string& what, int peer) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }  // -1 when unknown

 private:
  int peer_;
};

// Ranks disagree on the operation, shape or dtype of a collective (debug checks).
class MismatchError : public Error {
 public:
  using Error::Error;
};

// Bad arguments from the caller: wrong sizes, dtypes, ranks... -> ValueError.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The error `e` again, of the same type (a PeerError keeps its peer), with
// `prefix` in front of its message; a foreign exception becomes an Error.
// For errors of a background thread re-raised in the caller with context.
std::exception_ptr with_prefix(std::exception_ptr e, const std::string& prefix);

// A duration for a message: "1.5 s", "20 s".
std::string seconds(std::chrono::milliseconds ms);

// Ranks for a message: "rank 2", "ranks 1, 3".
std::string ranks_text(const std::vector<int>& ranks);

}  // namespace bagua
