#!/usr/bin/env python3
"""Makes and checks checkpoint files for the IO tests (run by tests/io/*_test.cpp at test time).

  make_io_cases.py safetensors OUT.safetensors   every dtype case, written by safetensors.torch
  make_io_cases.py torchbin DIR                  torch.save archives (views, tied weights, ...)
  make_io_cases.py npy DIR                       numpy.save files
  make_io_cases.py verify-safetensors FILE       FILE (written by C++) holds the dtype cases
  make_io_cases.py verify-npy DIR                DIR/<case>.npy (written by C++) hold the cases
  make_io_cases.py verify-sharded DIR            DIR holds the dtype cases as an HF sharded save

Every value is a pure function of (dtype, shape), computed identically in tests/io/io_cases.h,
so both sides compare bitwise. Exits non-zero with a message on any mismatch.
"""
import collections
import json
import os
import sys
import warnings
import zipfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

warnings.filterwarnings("ignore")  # TypedStorage deprecation noise in the test logs

# name -> (dtype, shape); mirrors dtype_cases() in tests/io/io_cases.h.
CASES = {
    "f64": (torch.float64, [3]),
    "f32": (torch.float32, [2, 3, 4]),
    "f16": (torch.float16, [4, 5]),
    "bf16": (torch.bfloat16, [2, 3]),
    "i64": (torch.int64, [5]),
    "i32": (torch.int32, [2, 2]),
    "i16": (torch.int16, [3]),
    "i8": (torch.int8, [6]),
    "u64": (torch.uint64, [2]),
    "u32": (torch.uint32, [2]),
    "u16": (torch.uint16, [2]),
    "u8": (torch.uint8, [7]),
    "bool": (torch.bool, [9]),
    "f8_e4m3": (torch.float8_e4m3fn, [2, 3]),
    "f8_e5m2": (torch.float8_e5m2, [2, 3]),
    "scalar": (torch.float32, []),
    "empty": (torch.float32, [0, 4]),
}
NUMPY_DTYPES = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                torch.int8, torch.uint64, torch.uint32, torch.uint16, torch.uint8, torch.bool}


def expected(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    idx = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        v = idx % 3 == 0
    elif dtype.is_floating_point:
        v = (idx.to(torch.float64) * 0.25 - 1.0).to(dtype)
    elif dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        v = (idx * 37 % 251).to(dtype)
    else:
        v = (idx * 37 % 251 - 125).to(dtype)
    return v.reshape(shape)


def expected_cases(numpy_only=False):
    return {name: expected(dt, shape) for name, (dt, shape) in CASES.items()
            if not numpy_only or dt in NUMPY_DTYPES}


def fail(message):
    print("MISMATCH: " + message)
    sys.exit(1)


def compare(name, got, want):
    if got.dtype != want.dtype or list(got.shape) != list(want.shape):
        fail(f"{name}: got {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}")
    # Bitwise: compare the raw bytes (NaN-safe, works for fp8).
    if got.numel() and not torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
        fail(f"{name}: values differ: got {got.flatten()[:8]} want {want.flatten()[:8]}")


def compare_maps(got, want, what):
    if set(got) != set(want):
        fail(f"{what}: keys {sorted(got)} != {sorted(want)}")
    for k in want:
        compare(f"{what}: {k}", got[k], want[k])


def base():
    return torch.arange(12, dtype=torch.float32).reshape(4, 3) * 0.5 - 3.0  # [4, 3]


def make_torchbin(out):
    os.makedirs(out, exist_ok=True)
    w = base()
    sd = collections.OrderedDict()
    sd["w"] = w
    sd["tied"] = w                      # same tensor object: one storage
    sd["t"] = w.t()                     # transposed view of w's storage
    sd["slice"] = w[1:3]                # storage offset 3
    sd["col"] = w[:, 1]                 # offset 1, stride 3
    sd["h"] = (torch.arange(6).reshape(2, 3) * 0.5).half()
    sd["b"] = (torch.arange(6).reshape(3, 2) * 0.25).bfloat16()
    sd["i"] = torch.arange(5) - 2
    sd["bool"] = torch.tensor([True, False, True])
    sd["p"] = torch.nn.Parameter(torch.ones(2))
    sd["scalar"] = torch.tensor(3.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["f8"] = (torch.arange(4) * 0.5).to(torch.float8_e4m3fn)  # saved with _rebuild_tensor_v3
    sd["u16"] = torch.arange(3).to(torch.uint16)
    sd["i8"] = torch.arange(4, dtype=torch.int8) - 2
    sd["d"] = torch.arange(3, dtype=torch.float64) / 4
    torch.save(sd, os.path.join(out, "views.bin"))
    torch.save(sd, os.path.join(out, "views_p4.bin"), pickle_protocol=4)
    torch.save(sd, os.path.join(out, "legacy.bin"), _use_new_zipfile_serialization=False)

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    msd = module.state_dict()                       # OrderedDict with _metadata (pickle BUILD)
    torch.save(msd, os.path.join(out, "module.bin"))
    save_file({k: v.contiguous() for k, v in msd.items()}, os.path.join(out, "module.safetensors"))

    # Sharded .bin: two shards plus pytorch_model.bin.index.json.
    sharded = os.path.join(out, "bin_sharded")
    os.makedirs(sharded, exist_ok=True)
    names = list(msd)
    split = {"pytorch_model-00001-of-00002.bin": names[:2], "pytorch_model-00002-of-00002.bin": names[2:]}
    weight_map = {}
    for shard, keys in split.items():
        torch.save(collections.OrderedDict((k, msd[k]) for k in keys), os.path.join(sharded, shard))
        weight_map.update({k: shard for k in keys})
    with open(os.path.join(sharded, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)

    # Refused content: a non-tensor value, a foreign global, a view past its storage.
    torch.save(collections.OrderedDict(w=w, step=3), os.path.join(out, "non_tensor.bin"))
    torch.save(collections.OrderedDict(w=w, when=collections.Counter("ab")),
               os.path.join(out, "foreign_global.bin"))

    class PastStorage:
        def __reduce__(self):
            storage = torch.zeros(4).storage()
            return (torch._utils._rebuild_tensor_v2,
                    (storage, 0, (100,), (1,), False, collections.OrderedDict()))
    torch.save(collections.OrderedDict(w=PastStorage()), os.path.join(out, "past_storage.bin"))

    # A valid archive whose data.pkl uses the protocol-0 INT opcode, which we do not support.
    src = os.path.join(out, "views.bin")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(os.path.join(out, "bad_opcode.bin"), "w",
                                                      zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("data.pkl"):
                data = b"\x80\x02I1\n."
            zout.writestr(info.filename.replace("views/", "bad_opcode/"), data)


def make_npy(out):
    os.makedirs(out, exist_ok=True)
    for name, v in expected_cases(numpy_only=True).items():
        np.save(os.path.join(out, name + ".npy"), v.numpy())
    a = expected(torch.float32, [3, 4]).numpy()
    np.save(os.path.join(out, "fortran2d.npy"), np.asfortranarray(a))
    b = expected(torch.int32, [2, 3, 4]).numpy()
    np.save(os.path.join(out, "fortran3d.npy"), np.asfortranarray(b))
    with open(os.path.join(out, "v2.npy"), "wb") as f:
        np.lib.format.write_array(f, a, version=(2, 0))
    np.save(os.path.join(out, "big_endian.npy"), a.astype(">f4"))
    np.save(os.path.join(out, "complex.npy"), np.zeros(3, dtype=np.complex64))


def verify_safetensors(path):
    compare_maps(load_file(path), expected_cases(), path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("origin") != "c++":
        fail(f"{path}: metadata {meta} lacks origin=c++")


def verify_npy(directory):
    for name, want in expected_cases(numpy_only=True).items():
        got = torch.from_numpy(np.load(os.path.join(directory, name + ".npy")))
        compare(name, got, want)


def verify_sharded(directory):
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    want = expected_cases()
    got = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(directory, shard), framework="pt") as f:
            if (f.metadata() or {}).get("format") != "pt":
                fail(f"{shard}: metadata lacks format=pt")
        got.update(load_file(os.path.join(directory, shard)))
    compare_maps(got, want, directory)
    total = sum(v.numel() * v.element_size() for v in want.values())
    if index["metadata"]["total_size"] != total:
        fail(f"total_size {index['metadata']['total_size']} != {total}")
    if any(index["weight_map"][k] not in os.listdir(directory) for k in want):
        fail("weight_map names a missing shard")


def main():
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == "safetensors":
        save_file(expected_cases(), arg, metadata={"origin": "python", "format": "pt"})
    elif mode == "torchbin":
        make_torchbin(arg)
    elif mode == "npy":
        make_npy(arg)
    elif mode == "verify-safetensors":
        verify_safetensors(arg)
    elif mode == "verify-npy":
        verify_npy(arg)
    elif mode == "verify-sharded":
        verify_sharded(arg)
    else:
        fail("unknown mode " + mode)
    print("ok")


if __name__ == "__main__":
    main()
