#pragma once
// A small, non-recursive unpickler for the subset of the pickle protocol (0-5, binary opcodes)
// that torch.save emits for state dicts. It knows nothing about torch: globals, REDUCE, BUILD and
// persistent ids are delegated to PickleHooks, which decide what is allowed. Objects are shared
// through the memo by pointer, so a value referenced twice (a tied weight) is the same object.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dschat {
namespace io {

struct PickleValue;
using PickleValuePtr = std::shared_ptr<PickleValue>;

struct PickleValue {
  enum class Kind { None, Bool, Int, Float, String, Bytes, Tuple, List, Dict, Global, Tensor, Storage };

  Kind kind = Kind::None;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0.0;
  std::string text;                  // String, Bytes, or Global as "module.name"
  std::vector<PickleValuePtr> items;  // Tuple and List elements
  std::vector<std::pair<PickleValuePtr, PickleValuePtr>> entries;  // Dict, in insertion order
  std::unordered_map<std::string, size_t> string_keys;             // Dict: string key -> index
  torch::Tensor tensor;               // Tensor
  c10::Storage storage;               // Storage (untyped bytes)
  torch::ScalarType storage_dtype = torch::kByte;  // Storage: element type of a typed storage

  PickleValue() = default;
  /// Releases nested containers iteratively: a hostile pickle can nest millions of lists.
  ~PickleValue();
  PickleValue(const PickleValue&) = delete;
  PickleValue& operator=(const PickleValue&) = delete;

  static PickleValuePtr make(Kind kind) {
    auto v = std::make_shared<PickleValue>();
    v->kind = kind;
    return v;
  }
  /// Inserts or replaces `key` (last write wins, as in Python).
  void set_item(PickleValuePtr key, PickleValuePtr value);

 private:
  void move_children_to(std::vector<PickleValuePtr>& out);
};

/// "a tuple of 3", "the string 'x'": for error messages.
std::string describe(const PickleValue& value);

/// Decides what the pickled globals, calls and persistent ids mean. Implementations throw
/// core::FormatError for anything they do not allow.
class PickleHooks {
 public:
  virtual ~PickleHooks() = default;
  /// GLOBAL / STACK_GLOBAL `module.name`.
  virtual PickleValuePtr global(const std::string& module, const std::string& name) = 0;
  /// REDUCE: `callable(*args)`; `args` is a tuple.
  virtual PickleValuePtr reduce(const PickleValue& callable, const PickleValue& args) = 0;
  /// BUILD: `obj.__setstate__(state)`; may modify `obj`.
  virtual void build(PickleValue& obj, const PickleValue& state) = 0;
  /// BINPERSID: the object named by persistent id `pid`.
  virtual PickleValuePtr persistent_load(const PickleValue& pid) = 0;
};

/// Runs the pickle program in [data, data + size) and returns the object STOP returns.
/// `where` (the file and record) starts every error message. Throws core::FormatError for
/// unknown opcodes, truncated input and stack misuse.
PickleValuePtr unpickle(const std::string& where, const uint8_t* data, size_t size,
                        PickleHooks& hooks);

}  // namespace io
}  // namespace dschat
