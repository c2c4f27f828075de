// load_torch_bin: reads the zip archive written by torch.save (pytorch_model.bin) with LibTorch's
// PyTorchStreamReader and interprets its data.pkl with our own restricted unpickler, because
// torch::pickle_load cannot rebuild a Python OrderedDict of tensors.
#include <caffe2/serialize/inline_container.h>

#include <fstream>
#include <limits>
#include <set>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/pickle_vm.h"

namespace dschat {
namespace io {
namespace {

using Kind = PickleValue::Kind;

// torch.<Name>Storage -> element type. UntypedStorage (used with _rebuild_tensor_v3) is bytes.
const std::map<std::string, torch::ScalarType>& storage_types() {
  static const std::map<std::string, torch::ScalarType> types = {
      {"torch.DoubleStorage", torch::kFloat64}, {"torch.FloatStorage", torch::kFloat32},
      {"torch.HalfStorage", torch::kFloat16},   {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kInt64},     {"torch.IntStorage", torch::kInt32},
      {"torch.ShortStorage", torch::kInt16},    {"torch.CharStorage", torch::kInt8},
      {"torch.ByteStorage", torch::kUInt8},     {"torch.BoolStorage", torch::kBool},
      {"torch.ComplexFloatStorage", torch::kComplexFloat},
      {"torch.ComplexDoubleStorage", torch::kComplexDouble},
      {"torch.storage.UntypedStorage", torch::kUInt8},
  };
  return types;
}

// torch.<dtype> globals passed to _rebuild_tensor_v3 (dtypes without a legacy storage class).
const std::map<std::string, torch::ScalarType>& dtype_globals() {
  static const std::map<std::string, torch::ScalarType> types = {
      {"torch.float64", torch::kFloat64},         {"torch.float32", torch::kFloat32},
      {"torch.float16", torch::kFloat16},         {"torch.bfloat16", torch::kBFloat16},
      {"torch.int64", torch::kInt64},             {"torch.int32", torch::kInt32},
      {"torch.int16", torch::kInt16},             {"torch.int8", torch::kInt8},
      {"torch.uint8", torch::kUInt8},             {"torch.uint16", torch::kUInt16},
      {"torch.uint32", torch::kUInt32},           {"torch.uint64", torch::kUInt64},
      {"torch.bool", torch::kBool},               {"torch.float8_e4m3fn", torch::kFloat8_e4m3fn},
      {"torch.float8_e5m2", torch::kFloat8_e5m2}, {"torch.complex64", torch::kComplexFloat},
      {"torch.complex128", torch::kComplexDouble},
  };
  return types;
}

// Callables and markers torch.save uses for plain state dicts; everything else is refused.
const std::set<std::string>& allowed_globals() {
  static const std::set<std::string> names = {
      "collections.OrderedDict",           "torch._utils._rebuild_tensor_v2",
      "torch._utils._rebuild_tensor_v3",   "torch._utils._rebuild_parameter",
      "torch._utils._rebuild_parameter_with_state", "torch._tensor._rebuild_from_type_v2",
      "torch._tensor.Tensor",              "torch.nn.parameter.Parameter",
      "torch.serialization._get_layout",   "torch.strided"};
  return names;
}

class TorchBinHooks : public PickleHooks {
 public:
  TorchBinHooks(std::string where, caffe2::serialize::PyTorchStreamReader& reader)
      : where_(std::move(where)), reader_(reader) {}

  PickleValuePtr global(const std::string& module, const std::string& name) override {
    std::string full = module + "." + name;
    bool ok = allowed_globals().count(full) || storage_types().count(full) ||
              dtype_globals().count(full);
    DSCHAT_CHECK(ok, FormatError, where_, ": unsupported pickle global '", full,
                 "' (only plain state dicts of tensors are supported)");
    auto v = PickleValue::make(Kind::Global);
    v->text = full;
    return v;
  }

  PickleValuePtr reduce(const PickleValue& callable, const PickleValue& args) override {
    const auto& a = args.items;
    const std::string& f = callable.kind == Kind::Global ? callable.text : "";
    if (f == "collections.OrderedDict" && a.empty()) return PickleValue::make(Kind::Dict);
    if (f == "torch._utils._rebuild_tensor_v2" && (a.size() == 6 || a.size() == 7)) {
      return rebuild_tensor(*a[0], *a[1], *a[2], *a[3], std::nullopt);
    }
    if (f == "torch._utils._rebuild_tensor_v3" && (a.size() == 7 || a.size() == 8)) {
      auto dtype = dtype_globals().find(a[6]->text);
      DSCHAT_CHECK(a[6]->kind == Kind::Global && dtype != dtype_globals().end(), FormatError,
                   where_, ": _rebuild_tensor_v3 dtype is ", describe(*a[6]));
      return rebuild_tensor(*a[0], *a[1], *a[2], *a[3], dtype->second);
    }
    if ((f == "torch._utils._rebuild_parameter" && a.size() == 3) ||
        (f == "torch._utils._rebuild_parameter_with_state" && a.size() == 4)) {
      // A Parameter is stored as (data, requires_grad, hooks[, state]): keep the data tensor.
      DSCHAT_CHECK(a[0]->kind == Kind::Tensor, FormatError, where_, ": ", f, " of ", describe(*a[0]));
      return a[0];
    }
    if (f == "torch._tensor._rebuild_from_type_v2" && a.size() == 4) {
      // (func, type, args, state): a Tensor subclass wrapper around func(*args).
      DSCHAT_CHECK(a[2]->kind == Kind::Tuple, FormatError, where_, ": _rebuild_from_type_v2 args are ",
                   describe(*a[2]));
      return reduce(*a[0], *a[2]);
    }
    if (f == "torch.serialization._get_layout" && a.size() == 1) return PickleValue::make(Kind::None);
    DSCHAT_THROW(FormatError, where_, ": unsupported pickle call ",
                 f.empty() ? describe(callable) : f, " with ", a.size(), " arguments");
  }

  void build(PickleValue& obj, const PickleValue& state) override {
    // state_dict() attaches `_metadata` (per-module versions) as attributes of the OrderedDict,
    // and tensors may carry Python attributes: neither matters for the weights.
    DSCHAT_CHECK(obj.kind == Kind::Dict || obj.kind == Kind::Tensor, FormatError, where_,
                 ": BUILD on ", describe(obj), " with ", describe(state));
  }

  PickleValuePtr persistent_load(const PickleValue& pid) override {
    const auto& t = pid.items;
    DSCHAT_CHECK(pid.kind == Kind::Tuple && t.size() == 5 && t[0]->kind == Kind::String &&
                     t[0]->text == "storage" && t[1]->kind == Kind::Global &&
                     t[2]->kind == Kind::String && t[4]->kind == Kind::Int,
                 FormatError, where_,
                 ": persistent id must be ('storage', type, key, location, numel), got ", describe(pid));
    const std::string& key = t[2]->text;
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;  // shared storage: read once

    auto type = storage_types().find(t[1]->text);
    DSCHAT_CHECK(type != storage_types().end(), FormatError, where_, ": storage '", key,
                 "' has unsupported type ", t[1]->text);
    const std::string record = "data/" + key;
    DSCHAT_CHECK(reader_.hasRecord(record), FormatError, where_, ": storage record '", record,
                 "' is missing from the archive");
    auto [data, nbytes] = reader_.getRecord(record);
    const int64_t numel = t[4]->integer;
    const uint64_t itemsize = c10::elementSize(type->second);
    DSCHAT_CHECK(numel >= 0 && static_cast<uint64_t>(numel) <= nbytes / itemsize &&
                     static_cast<uint64_t>(numel) * itemsize == nbytes,
                 FormatError, where_, ": storage '", key, "' declares ", numel, " elements of ",
                 itemsize, " bytes but its record holds ", nbytes, " bytes");
    auto v = PickleValue::make(Kind::Storage);
    // Not resizable: a bad view must fail our bounds check, never grow the storage.
    v->storage = c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), nullptr,
                              /*resizable=*/false);
    v->storage_dtype = type->second;
    storages_.emplace(key, v);
    return v;
  }

 private:
  std::vector<int64_t> int_tuple(const PickleValue& v, const char* what) {
    DSCHAT_CHECK(v.kind == Kind::Tuple, FormatError, where_, ": tensor ", what, " is ", describe(v));
    std::vector<int64_t> out;
    for (const auto& item : v.items) {
      DSCHAT_CHECK(item->kind == Kind::Int && item->integer >= 0, FormatError, where_, ": tensor ",
                   what, " element is ", describe(*item));
      out.push_back(item->integer);
    }
    return out;
  }

  // storage.as_strided(size, stride, offset) with every index checked against the storage.
  PickleValuePtr rebuild_tensor(const PickleValue& storage, const PickleValue& offset_value,
                                const PickleValue& size_value, const PickleValue& stride_value,
                                std::optional<torch::ScalarType> dtype_override) {
    DSCHAT_CHECK(storage.kind == Kind::Storage, FormatError, where_,
                 ": tensor storage is ", describe(storage));
    DSCHAT_CHECK(offset_value.kind == Kind::Int && offset_value.integer >= 0, FormatError, where_,
                 ": tensor storage offset is ", describe(offset_value));
    std::vector<int64_t> size = int_tuple(size_value, "size");
    std::vector<int64_t> stride = int_tuple(stride_value, "stride");
    DSCHAT_CHECK(size.size() == stride.size(), FormatError, where_, ": tensor size has ",
                 size.size(), " dims but stride has ", stride.size());
    const torch::ScalarType dtype = dtype_override.value_or(storage.storage_dtype);
    const uint64_t itemsize = c10::elementSize(dtype);
    const uint64_t capacity = storage.storage.nbytes() / itemsize;  // elements
    // Highest element index touched, with overflow checks; empty tensors touch nothing.
    uint64_t last = static_cast<uint64_t>(offset_value.integer);
    bool empty = false;
    bool overflow = false;
    for (size_t i = 0; i < size.size(); ++i) {
      if (size[i] == 0) empty = true;
      uint64_t span = 0;
      overflow |= __builtin_mul_overflow(static_cast<uint64_t>(std::max<int64_t>(size[i] - 1, 0)),
                                         static_cast<uint64_t>(stride[i]), &span);
      overflow |= __builtin_add_overflow(last, span, &last);
    }
    DSCHAT_CHECK(!overflow && (empty || last < capacity), FormatError, where_,
                 ": tensor view (offset ", offset_value.integer, ", size ", c10::IntArrayRef(size),
                 ", stride ", c10::IntArrayRef(stride), ") reaches past its ", capacity,
                 "-element storage");
    if (dtype == torch::kBool && !empty) {
      // Bytes other than 0/1 are undefined behaviour for bool kernels (checked as for safetensors).
      const auto* bytes = static_cast<const uint8_t*>(storage.storage.data());
      for (size_t i = 0; i < storage.storage.nbytes(); ++i) {
        DSCHAT_CHECK(bytes[i] <= 1, FormatError, where_, ": bool storage byte ", i, " is ",
                     int(bytes[i]), ", expected 0 or 1");
      }
    }
    torch::Tensor t = torch::empty({0}, torch::TensorOptions().dtype(dtype));  // [0] until set_
    t.set_(storage.storage, offset_value.integer, size, stride);  // [size...] aliasing the storage
    auto v = PickleValue::make(Kind::Tensor);
    v->tensor = std::move(t);
    return v;
  }

  std::string where_;
  caffe2::serialize::PyTorchStreamReader& reader_;
  std::map<std::string, PickleValuePtr> storages_;
};

}  // namespace

TensorMap load_torch_bin(const std::filesystem::path& file) {
  const std::string where = file.string();
  DSCHAT_CHECK(std::filesystem::is_regular_file(file), IoError, where,
               ": cannot open for reading: no such regular file");
  {
    // Before torch 1.6 torch.save wrote a bare pickle stream, not a zip archive.
    std::ifstream in(file, std::ios::binary);
    char magic[2] = {0, 0};
    in.read(magic, 2);
    DSCHAT_CHECK(!(magic[0] == '\x80' && magic[1] == '\x02'), FormatError, where,
                 ": legacy (pre-1.6, non-zip) torch.save format is not supported; re-save it with "
                 "a recent torch or convert it to safetensors");
  }
  try {
    caffe2::serialize::PyTorchStreamReader reader(where);
    if (reader.hasRecord("byteorder")) {
      auto [order, n] = reader.getRecord("byteorder");
      std::string text(static_cast<const char*>(order.get()), n);
      DSCHAT_CHECK(text == "little", FormatError, where, ": byteorder is '", text,
                   "', only little-endian archives are supported");
    }
    DSCHAT_CHECK(reader.hasRecord("data.pkl"), FormatError, where,
                 ": no data.pkl record; not a torch.save archive");
    auto [pickle, pickle_size] = reader.getRecord("data.pkl");
    TorchBinHooks hooks(where + ": data.pkl", reader);
    PickleValuePtr root = unpickle(where + ": data.pkl", static_cast<const uint8_t*>(pickle.get()),
                                   pickle_size, hooks);
    DSCHAT_CHECK(root->kind == Kind::Dict, FormatError, where,
                 ": expected a state dict (dict of tensors), found ", describe(*root));
    TensorMap tensors;
    for (const auto& [key, value] : root->entries) {
      DSCHAT_CHECK(key->kind == Kind::String, FormatError, where, ": state dict key is ",
                   describe(*key));
      DSCHAT_CHECK(value->kind == Kind::Tensor, FormatError, where, ": key '", key->text,
                   "' holds ", describe(*value), ", not a tensor");
      tensors[key->text] = value->tensor;
    }
    return tensors;
  } catch (const c10::Error& e) {
    // The zip reader reports corruption (bad central directory, CRC, truncation) as c10::Error.
    DSCHAT_THROW(FormatError, where, ": cannot read the torch.save zip archive: ",
                 e.what_without_backtrace());
  }
}

}  // namespace io
}  // namespace dschat
