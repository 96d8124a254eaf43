// Python binding of the rendezvous store: Store (base), TcpStore, TcpStoreServer.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>

#include "bindings/bindings.h"
#include "common/error.h"
#include "store/store.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"

namespace py = pybind11;

namespace bagua {
namespace bindings {

namespace {

std::chrono::milliseconds to_ms(double seconds, const char* what) {
  if (std::isnan(seconds) || seconds < 0) {
    throw InvalidArgument(std::string(what) + " must be a non-negative number of seconds");
  }
  constexpr double kMax = 10.0 * 365 * 24 * 3600;  // "forever"
  return std::chrono::milliseconds(int64_t(std::ceil(std::min(seconds, kMax) * 1000.0)));
}

std::chrono::milliseconds timeout_or_default(Store& s, std::optional<double> t) {
  return t ? to_ms(*t, "timeout_s") : s.timeout();
}

std::vector<uint8_t> to_bytes(const py::bytes& b) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  PyBytes_AsStringAndSize(b.ptr(), &data, &size);
  return std::vector<uint8_t>(data, data + size);
}

py::bytes from_bytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

}  // namespace

void bind_store(py::module_& m) {
  py::class_<Store, std::shared_ptr<Store>>(m, "Store",
                                            "Rendezvous key-value store (values are bytes; blocking calls time out).")
      .def(
          "set",
          [](Store& s, const std::string& key, const py::bytes& value) {
            auto v = to_bytes(value);
            py::gil_scoped_release release;
            s.set(key, v);
          },
          py::arg("key"), py::arg("value"))
      .def(
          "get",
          [](Store& s, const std::string& key, std::optional<double> timeout_s) {
            auto t = timeout_or_default(s, timeout_s);
            std::vector<uint8_t> v;
            {
              py::gil_scoped_release release;
              v = s.get(key, t);
            }
            return from_bytes(v);
          },
          py::arg("key"), py::arg("timeout_s") = py::none(), "Blocks until the key is set, then returns its value.")
      .def("add", &Store::add, py::arg("key"), py::arg("delta"), py::call_guard<py::gil_scoped_release>(),
           "Atomically adds delta to an integer counter (created at 0); returns the new value.")
      .def(
          "wait",
          [](Store& s, const std::vector<std::string>& keys, std::optional<double> timeout_s) {
            auto t = timeout_or_default(s, timeout_s);
            py::gil_scoped_release release;
            s.wait(keys, t);
          },
          py::arg("keys"), py::arg("timeout_s") = py::none(), "Blocks until every key is set.")
      .def("check", &Store::check, py::arg("keys"), py::call_guard<py::gil_scoped_release>(),
           "Whether every key is set (does not block).")
      .def("dead_ranks", &Store::dead_ranks, py::call_guard<py::gil_scoped_release>(),
           "Ranks whose store connection closed without a clean goodbye.")
      .def_property_readonly("timeout_s", [](const Store& s) { return s.timeout().count() / 1000.0; });

  py::class_<TcpStore, Store, std::shared_ptr<TcpStore>>(m, "TcpStore",
                                                         "Client of a TcpStoreServer (connects, retrying, until "
                                                         "timeout_s; says goodbye on close()).")
      .def(py::init([](const std::string& host, int port, int rank, double timeout_s, const std::string& secret,
                       std::optional<double> connect_timeout_s) {
             auto t = to_ms(timeout_s, "timeout_s");
             auto c = connect_timeout_s ? to_ms(*connect_timeout_s, "connect_timeout_s") : std::chrono::milliseconds(0);
             py::gil_scoped_release release;
             return std::make_shared<TcpStore>(host, port, rank, t, secret, c);
           }),
           py::arg("host"), py::arg("port"), py::arg("rank") = -1, py::arg("timeout_s") = 600.0, py::arg("secret") = "",
           py::arg("connect_timeout_s") = py::none())
      .def("close", &TcpStore::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("host", &TcpStore::host)
      .def_property_readonly("port", &TcpStore::port)
      .def_property_readonly("rank", &TcpStore::rank)
      .def("__enter__", [](std::shared_ptr<TcpStore> s) { return s; })
      .def("__exit__", [](TcpStore& s, py::args) {
        py::gil_scoped_release release;
        s.close();
      });

  py::class_<TcpStoreServer, std::shared_ptr<TcpStoreServer>>(
      m, "TcpStoreServer", "Rendezvous store server; serves from a background thread until close().")
      .def(py::init([](const std::string& host, int port, double io_timeout_s, const std::string& secret,
                       size_t max_value_bytes, size_t max_total_bytes, size_t max_connections, size_t max_handshakes,
                       std::optional<double> idle_timeout_s) {
             TcpStoreServerOptions o;
             o.io_timeout = to_ms(io_timeout_s, "io_timeout_s");
             if (idle_timeout_s) o.idle_timeout = to_ms(*idle_timeout_s, "idle_timeout_s");
             o.secret = secret;
             o.max_value_bytes = max_value_bytes;
             o.max_total_bytes = max_total_bytes;
             o.max_connections = max_connections;
             o.max_handshakes = max_handshakes;
             return std::make_shared<TcpStoreServer>(host, port, o);
           }),
           py::arg("host"), py::arg("port"), py::arg("io_timeout_s") = 30.0, py::arg("secret") = "",
           py::arg("max_value_bytes") = TcpStoreServerOptions{}.max_value_bytes,
           py::arg("max_total_bytes") = TcpStoreServerOptions{}.max_total_bytes,
           py::arg("max_connections") = TcpStoreServerOptions{}.max_connections,
           py::arg("max_handshakes") = TcpStoreServerOptions{}.max_handshakes, py::arg("idle_timeout_s") = py::none(),
           "Listens on host:port (port 0 picks a free one). io_timeout_s bounds how long a client may take to "
           "say hello and authenticate, finish a message or read a reply before it is disconnected; "
           "idle_timeout_s (default 60; 0: never) how long an authenticated connection may stay silent "
           "outside a blocking request (TcpStore clients ping theirs). Clients "
           "must prove they hold `secret`; a SET may store at most max_value_bytes, and the store at most "
           "max_total_bytes in all; keys are written once.")
      .def_property_readonly("host", &TcpStoreServer::host)
      .def_property_readonly("port", &TcpStoreServer::port)
      .def("close", &TcpStoreServer::close, py::call_guard<py::gil_scoped_release>())
      .def("__enter__", [](std::shared_ptr<TcpStoreServer> s) { return s; })
      .def("__exit__", [](TcpStoreServer& s, py::args) {
        py::gil_scoped_release release;
        s.close();
      });
}

}  // namespace bindings
}  // namespace bagua
