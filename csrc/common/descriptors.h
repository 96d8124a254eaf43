// Running out of file descriptors, said plainly. Socket libraries report it
// obliquely (Gloo: "Unable to find address for: 127.0.0.1"), so places that
// open sockets ask out_of_descriptors() when something failed and then raise
// out_of_descriptors_error() instead.
#pragma once

#include <string>

namespace bagua {

// Whether this process cannot open one more descriptor right now (EMFILE or
// ENFILE); probes by opening and closing one.
bool out_of_descriptors();

// "out of file descriptors (RLIMIT_NOFILE=1024) while <doing>;
//  raise the limit (ulimit -n) or open fewer files"
std::string out_of_descriptors_message(const std::string& doing);

}  // namespace bagua
