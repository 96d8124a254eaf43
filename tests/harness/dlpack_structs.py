"""The DLPack ABI in ctypes, to hand-build capsules in tests (byte offsets,
deleters, devices no producer here offers)."""

import ctypes


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


def legacy_capsule(managed: DLManagedTensor):
    """A "dltensor" capsule pointing at ``managed`` (which the caller keeps alive)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(managed), b"dltensor", None)


_KEEP = []  # fake exports live for the whole process: their consumers may outlive the producer


class FakeDeviceArray:
    """A float32 DLPack producer claiming memory on another device (e.g. CUDA,
    device type 2). Nothing reads the memory, so no GPU is needed."""

    def __init__(self, n: int, device_type: int = 2):
        self.host = (ctypes.c_float * n)()
        self.n, self.device_type = n, device_type

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, stream=None, max_version=None, **_):
        shape = (ctypes.c_int64 * 1)(self.n)
        m = DLManagedTensor()
        m.dl_tensor = DLTensor(
            ctypes.addressof(self.host), DLDevice(self.device_type, 0), 1, DLDataType(2, 32, 1), shape, None, 0
        )
        _KEEP.append((self.host, shape, m))
        return legacy_capsule(m)
