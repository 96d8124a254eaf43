#include "common/error.h"

namespace bagua {

std::exception_ptr with_prefix(std::exception_ptr e, const std::string& prefix) {
  try {
    std::rethrow_exception(e);
  } catch (const TimeoutError& x) {
    return std::make_exception_ptr(TimeoutError(prefix + x.what()));
  } catch (const PeerError& x) {
    return std::make_exception_ptr(PeerError(prefix + x.what(), x.peer()));
  } catch (const MismatchError& x) {
    return std::make_exception_ptr(MismatchError(prefix + x.what()));
  } catch (const Error& x) {
    return std::make_exception_ptr(Error(prefix + x.what()));
  } catch (const InvalidArgument& x) {
    return std::make_exception_ptr(InvalidArgument(prefix + x.what()));
  } catch (const std::exception& x) {
    return std::make_exception_ptr(Error(prefix + x.what()));
  } catch (...) {
    return std::make_exception_ptr(Error(prefix + "unknown error"));
  }
}

std::string seconds(std::chrono::milliseconds ms) {
  std::string s = std::to_string(ms.count() / 1000.0);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s + " s";
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace bagua
