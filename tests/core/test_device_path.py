"""The engine's device path in one process, on the host implementation of a
Device (``_C.Device.host(delay_us)``: host memory, each stream an ordered queue
on its own thread, a delay before every queued task). The same bucket, step and
engine code runs on a GPU with ``Device.cuda(i)``.

What must hold: buckets, results, state and scratch live on the device; the
comm stream waits for the producer stream's event before reading a bucket; the
consumer stream waits for the comm stream before the optimizer reads it; and
the device path computes exactly what the plain host path computes. The delays
make a missing wait a wrong value, not a lucky race. Multi-process runs (every
algorithm, 3 ranks, staging through Gloo) are in test_device_path_ranks.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from bagua_core import _C, engine as E
from bagua_core.errors import BaguaError

DELAY_US = 20_000  # per queued task: far longer than the host's own work on these sizes


@pytest.fixture(scope="module")
def comm():
    return _C.create_gloo_communicator(None, "device-path", 0, 1, 10.0, "127.0.0.1")


def device_engine(comm, device, **kw):
    return E.Engine(_C.stage_through_host(comm, device), device=device, timeout_s=10.0, **kw)


def values(n, seed=0):
    return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def write(device, stream, view, array):
    device.write_async(view.address, np.ascontiguousarray(array).tobytes(), stream)


def read(device, stream, view, dtype=np.float32):
    """The view's bytes as they are at this point of `stream`."""
    out = np.empty(view.nbytes, np.uint8)
    device.copy_async(out.ctypes.data, view.address, view.nbytes, stream)
    device.synchronize(stream)
    return out.view(dtype)


def host_reference(comm, step, params, data, alignment=1):
    """The plain host path's result for one step over `data`."""
    eng = E.Engine(comm, timeout_s=10.0)
    [b] = eng.create_buckets([("g", data.shape, "float32")], alignment=alignment)
    b.append_op(step, **params)
    np.asarray(b.view("g"))[...] = data
    eng.mark_ready("g")
    eng.wait()
    out = np.asarray(b.view("g")).copy()
    eng.close()
    return out


def test_device_basics():
    d = _C.Device.host(delay_us=0)
    assert d.type == "cpu" and d.index == 0 and "host device" in d.describe()
    s1, s2 = d.new_stream(), d.new_stream()
    assert s1 != s2 and s1 != 0
    buf = np.zeros(4, np.float32)
    write(d, s1, type("V", (), {"address": buf.ctypes.data, "nbytes": buf.nbytes})(), np.arange(4, dtype=np.float32))
    d.synchronize(s1)
    assert buf.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="another device"):
        d.synchronize(_C.Device.host().new_stream())
    with pytest.raises(ValueError, match="timeout_s"):
        d.synchronize(s1, timeout_s=0)


def test_stream_order_and_timeout():
    d = _C.Device.host(delay_us=DELAY_US)
    s = d.new_stream()
    buf = np.zeros(3, np.float32)
    addr = buf.ctypes.data
    for k in range(3):  # each write lands DELAY_US after the previous one, in order
        d.write_async(addr, np.full(3, k, np.float32).tobytes(), s)
    assert buf.tolist() == [0, 0, 0]  # nothing ran yet: the caller does not wait
    with pytest.raises(BaguaError, match="did not reach the event"):
        d.synchronize(s, timeout_s=0.001)
    d.synchronize(s)
    assert buf.tolist() == [2, 2, 2]


def test_buckets_live_on_the_device(comm):
    d = _C.Device.host(delay_us=0)
    eng = device_engine(comm, d)
    [b] = eng.create_buckets([("w", (3, 4), "float32")])
    assert b._core.device is d and eng.device is d
    assert eng._core.device is d and eng._core.lane_stream(0) != 0
    v = b.view("w")
    assert v.__dlpack_device__() == (1, 0)  # kDLCPU: the host implementation's memory
    eng.close()


@pytest.mark.parametrize(
    "step,params,alignment",
    [
        ("bytegrad", {"hierarchical": False, "average": True}, 1),
        ("centralized_allreduce", {"hierarchical": False, "average": True}, 1),
    ],
)
def test_comm_stream_waits_for_the_producer(comm, step, params, alignment):
    """The gradient is written by a slow task on the producer stream; the
    engine must communicate what that task wrote (ByteGrad quantizes it),
    not the zeros that were there when mark_ready was called."""
    data = values(1000)
    want = host_reference(comm, step, params, data, alignment)
    d = _C.Device.host(delay_us=0)  # the comm stream runs at once...
    producer = d.new_stream(delay_us=DELAY_US)  # ...the gradient lands late
    eng = device_engine(comm, d)
    [b] = eng.create_buckets([("g", data.shape, "float32")], alignment=alignment)
    b.append_op(step, **params)
    for _ in range(2):  # the second step reuses everything bound in the first
        write(d, producer, b.view("g"), -data)
        write(d, producer, b.view("g"), data)
        eng.mark_ready("g", stream=producer)
        eng.wait(stream=producer)
        got = read(d, producer, b.view("g"))
        assert got.tobytes() == want.tobytes()
    eng.close()


def test_consumer_stream_waits_for_the_comm_stream(comm):
    """After wait(stream=consumer), work enqueued on the consumer (the
    optimizer) sees the step's result although the comm stream is slow: with
    the wait removed, the copy below would read the raw gradient."""
    data = values(5000, seed=1)
    want = host_reference(comm, "bytegrad", {"hierarchical": False, "average": True}, data)
    assert want.tobytes() != data.tobytes()  # quantized: the two are distinguishable
    d = _C.Device.host(delay_us=DELAY_US)
    consumer = _C.Device.host(delay_us=0)  # another device's stream is refused
    eng = device_engine(comm, d)
    [b] = eng.create_buckets([("g", data.shape, "float32")])
    b.append_op("bytegrad", hierarchical=False, average=True)
    fast = d.new_stream(delay_us=0)
    np.asarray(b.view("g"))[...] = data  # host-written: final, no producer stream
    eng.mark_ready("g")
    eng.wait(stream=fast)
    assert read(d, fast, b.view("g")).tobytes() == want.tobytes()
    # without a stream, wait() blocks until the device finished
    np.asarray(b.view("g"))[...] = data
    eng.mark_ready("g")
    eng.wait()
    assert np.asarray(b.view("g")).tobytes() == want.tobytes()
    np.asarray(b.view("g"))[...] = data
    with pytest.raises(ValueError, match="another device"):
        eng.mark_ready("g", stream=consumer.new_stream())
    eng.close()


def test_consumer_stream_waits_for_the_bucket_of_wait_any(comm):
    """wait_any(stream=consumer) makes the consumer wait for that bucket's
    device work (the optimizer of one bucket reads its result), and without a
    stream it blocks until the device finished the bucket."""
    data = values(5000, seed=3)
    want = host_reference(comm, "bytegrad", {"hierarchical": False, "average": True}, data)
    d = _C.Device.host(delay_us=DELAY_US)
    eng = device_engine(comm, d)
    b0, b1 = eng.create_buckets([("g0", data.shape, "float32"), ("g1", data.shape, "float32")], bucket_bytes=1)
    for b in (b0, b1):
        b.append_op("bytegrad", hierarchical=False, average=True)
    fast = d.new_stream(delay_us=0)
    np.asarray(b0.view("g0"))[...] = data
    eng.mark_ready("g0")
    assert eng.wait_any([0, 1], stream=fast) == 0
    assert read(d, fast, b0.view("g0")).tobytes() == want.tobytes()
    np.asarray(b1.view("g1"))[...] = data
    eng.mark_ready("g1")
    eng.wait_bucket(1)
    assert np.asarray(b1.view("g1")).tobytes() == want.tobytes()
    eng.wait()
    assert eng.steps == 1
    eng.close()


def test_weight_result_is_copied_back_in_consumer_order(comm):
    """Decentralized averaging writes its peer average into a result buffer on
    the device; copy_back(stream) enqueues result -> bucket on the consumer
    stream after wait(stream). At world size 1 the average is the weights."""
    d = _C.Device.host(delay_us=DELAY_US)
    eng = device_engine(comm, d)
    [b] = eng.create_buckets([("w", (300,), "float32")])
    op = b.append_op("decentralized", hierarchical=False, peer_selection_mode="all", communication_interval=1)
    consumer = d.new_stream(delay_us=0)
    w = values(300, seed=2)
    for step in range(2):
        write(d, consumer, b.view("w"), w + step)
        eng.mark_all_ready(stream=consumer)
        eng.wait(stream=consumer)
        write(d, consumer, b.view("w"), np.zeros(300, np.float32))  # the optimizer moves the weights meanwhile
        assert op.copy_back(stream=consumer)
        assert read(d, consumer, b.view("w")).tobytes() == (w + step).tobytes()
    eng.close()


def test_one_device_per_engine(comm):
    d = _C.Device.host()
    eng = device_engine(comm, d)
    eng.create_buckets([("a", (4,), "float32")])
    with pytest.raises(ValueError, match="one device per engine"):
        eng._core.add_bucket(_C.Bucket("x", 0, [("x", [4])], 1, None))
    with pytest.raises(ValueError, match="one device per engine"):
        eng._core.add_bucket(_C.Bucket("y", 0, [("y", [4])], 1, _C.Device.host()))
    eng.close()
