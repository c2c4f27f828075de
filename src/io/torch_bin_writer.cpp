// save_torch_bin: writes a state dict as torch.save does (pytorch_model.bin), so that
// torch.load(weights_only=True), transformers and DeepSpeed-Chat's own steps read it.
// The archive is LibTorch's PyTorchStreamWriter (zip, 64-byte aligned records); data.pkl is
// written here, by hand, in pickle protocol 2 with only the globals torch.save itself emits for a
// plain state dict: collections.OrderedDict, torch._utils._rebuild_tensor_v2 and the legacy
// storage classes. (torch::pickle_save cannot be used: it tags containers with
// torch.jit._pickle.restore_type_tag, which torch.load(weights_only=True) refuses.)
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <map>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/atomic_file.h"

namespace dschat {
namespace io {
namespace {

// The legacy storage class torch.save names for each element type (torch/storage.py).
const char* storage_class(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat64: return "DoubleStorage";
    case torch::kFloat32: return "FloatStorage";
    case torch::kFloat16: return "HalfStorage";
    case torch::kBFloat16: return "BFloat16Storage";
    case torch::kInt64: return "LongStorage";
    case torch::kInt32: return "IntStorage";
    case torch::kInt16: return "ShortStorage";
    case torch::kInt8: return "CharStorage";
    case torch::kUInt8: return "ByteStorage";
    case torch::kBool: return "BoolStorage";
    case torch::kComplexFloat: return "ComplexFloatStorage";
    case torch::kComplexDouble: return "ComplexDoubleStorage";
    default: return nullptr;
  }
}

// The protocol-2 opcodes a state dict needs (Python's Lib/pickle.py names).
namespace op {
constexpr char kProto = '\x80', kGlobal = 'c', kEmptyTuple = ')', kReduce = 'R', kMark = '(', kTuple = 't',
               kSetItems = 'u', kBinUnicode = 'X', kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kLong1 = '\x8a',
               kNewFalse = '\x89', kBinPersId = 'Q', kStop = '.';
}  // namespace op

class PickleWriter {
 public:
  void proto() { bytes_ += {op::kProto, '\x02'}; }
  void global(const std::string& module, const std::string& name) {
    bytes_ += op::kGlobal;
    bytes_ += module + "\n" + name + "\n";
  }
  void string(const std::string& text) {
    bytes_ += op::kBinUnicode;
    append_le(static_cast<uint64_t>(text.size()), 4);
    bytes_ += text;
  }
  void integer(int64_t value) {
    if (value >= 0 && value < 256) {
      bytes_ += op::kBinInt1;
      append_le(static_cast<uint64_t>(value), 1);
    } else if (value >= 0 && value < 65536) {
      bytes_ += op::kBinInt2;
      append_le(static_cast<uint64_t>(value), 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      bytes_ += op::kBinInt;
      append_le(static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(value))), 4);
    } else {  // two's complement, little-endian, 8 bytes (a valid LONG1 encoding)
      bytes_ += op::kLong1;
      bytes_ += '\x08';
      append_le(static_cast<uint64_t>(value), 8);
    }
  }
  void int_tuple(c10::IntArrayRef values) {
    if (values.empty()) {
      bytes_ += op::kEmptyTuple;
      return;
    }
    mark();
    for (int64_t v : values) integer(v);
    tuple();
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    bytes_ += op::kEmptyTuple;
    bytes_ += op::kReduce;
  }
  void mark() { bytes_ += op::kMark; }
  void tuple() { bytes_ += op::kTuple; }
  void reduce() { bytes_ += op::kReduce; }
  void set_items() { bytes_ += op::kSetItems; }
  void persistent_id() { bytes_ += op::kBinPersId; }
  void false_value() { bytes_ += op::kNewFalse; }
  void stop() { bytes_ += op::kStop; }
  const std::string& bytes() const { return bytes_; }

 private:
  void append_le(uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes_ += static_cast<char>((value >> (8 * i)) & 0xff);
  }
  std::string bytes_;
};

}  // namespace

void save_torch_bin(const std::filesystem::path& file, const TensorMap& tensors) {
  const std::string where = file.string();
  // Each tensor gets its own contiguous CPU storage, keyed "0", "1", ... in name order.
  std::vector<torch::Tensor> storages;
  PickleWriter pickle;
  pickle.proto();
  pickle.empty_ordered_dict();
  pickle.mark();
  for (const auto& [name, value] : tensors) {
    DSCHAT_CHECK(value.defined(), InvalidArgument, where, ": tensor '", name, "' is undefined");
    const char* storage = storage_class(value.scalar_type());
    DSCHAT_CHECK(storage != nullptr, InvalidArgument, where, ": tensor '", name, "' has dtype ", value.scalar_type(),
                 ", which a torch.save archive cannot hold as a legacy storage");
    const torch::Tensor data = value.detach().to(torch::kCPU).contiguous();
    const std::string key = std::to_string(storages.size());
    storages.push_back(data);
    pickle.string(name);
    // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks)
    pickle.global("torch._utils", "_rebuild_tensor_v2");
    pickle.mark();
    pickle.mark();  // the persistent id: ('storage', torch.<Type>Storage, key, 'cpu', numel)
    pickle.string("storage");
    pickle.global("torch", storage);
    pickle.string(key);
    pickle.string("cpu");
    pickle.integer(data.numel());
    pickle.tuple();
    pickle.persistent_id();
    pickle.integer(0);
    pickle.int_tuple(data.sizes());
    pickle.int_tuple(data.strides());
    pickle.false_value();
    pickle.empty_ordered_dict();
    pickle.tuple();
    pickle.reduce();
  }
  pickle.set_items();
  pickle.stop();

  AtomicFileWriter out(file);
  std::string write_error;  // the file's own error (a full disk), reported instead of the zip's
  caffe2::serialize::PyTorchStreamWriter writer([&out, &write_error](const void* data, size_t n) -> size_t {
    if (!write_error.empty()) return 0;
    try {
      out.write(data, n);
      return n;
    } catch (const std::exception& e) {
      write_error = e.what();
      return 0;  // the zip writer fails the record; nothing may throw through it
    }
  });
  try {
    writer.writeRecord("data.pkl", pickle.bytes().data(), pickle.bytes().size());
    writer.writeRecord("byteorder", "little", 6);
    for (size_t i = 0; i < storages.size(); ++i) {
      writer.writeRecord("data/" + std::to_string(i), storages[i].data_ptr(),
                         static_cast<size_t>(storages[i].numel()) * storages[i].element_size());
    }
    writer.writeEndOfFile();
  } catch (const c10::Error& e) {
    // Finalise it here (a failing finish still marks it finished): its destructor would otherwise
    // try again and throw during unwinding.
    try {
      writer.writeEndOfFile();
    } catch (const c10::Error&) {
    }
    if (!write_error.empty()) throw core::IoError(write_error);
    DSCHAT_THROW(IoError, where, ": cannot write the torch.save archive: ", e.what_without_backtrace());
  }
  DSCHAT_CHECK(write_error.empty(), IoError, write_error);
  out.commit();
}

}  // namespace io
}  // namespace dschat
