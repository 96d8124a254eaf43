// A host communicator (Gloo) serving buffers of a Device, in the order of the
// caller's stream (device/device.h).
//
// Every call first lets the stream finish the work enqueued before it
// (Device::synchronize, with the communicator's timeout): the buffers' bytes
// are final only then. On a device whose memory the host cannot touch (CUDA),
// inputs are copied into page-locked host staging memory on the stream before
// that wait, the wrapped communicator runs on the staging memory, and the
// outputs are copied back on the stream (asynchronously: later work on the
// stream sees them). On the host implementation the memory is the host's: the
// wrapped communicator runs on it directly once the stream finished. Staging
// memory grows to the largest call and is then reused: steady-state calls
// allocate nothing.
//
// This is how CUDA tensors travel on a Gloo group (no NCCL, or
// backend="gloo"; two ranks sharing one GPU, which NCCL refuses), and how the
// suite runs the engine's device path with the host implementation.
// device_type() is the device's; one thread at a time, as every communicator.
#pragma once

#include "comm/communicator.h"
#include "device/device.h"

namespace bagua {

CommunicatorPtr make_staged_communicator(CommunicatorPtr host_comm, DevicePtr device);

}  // namespace bagua
