#include "io/pickle_vm.h"

#include <cstring>
#include <iomanip>
#include <sstream>

#include "dschat/core/error.h"

namespace dschat {
namespace io {

PickleValue::~PickleValue() {
  std::vector<PickleValuePtr> pending;
  move_children_to(pending);
  while (!pending.empty()) {
    PickleValuePtr child = std::move(pending.back());
    pending.pop_back();
    // The last owner empties the child before it dies, so no destructor recurses.
    if (child && child.use_count() == 1) child->move_children_to(pending);
  }
}

void PickleValue::move_children_to(std::vector<PickleValuePtr>& out) {
  for (auto& item : items) out.push_back(std::move(item));
  for (auto& entry : entries) {
    out.push_back(std::move(entry.first));
    out.push_back(std::move(entry.second));
  }
  items.clear();
  entries.clear();
}

void PickleValue::set_item(PickleValuePtr key, PickleValuePtr value) {
  if (key->kind == Kind::String) {
    auto found = string_keys.find(key->text);
    if (found != string_keys.end()) {
      entries[found->second].second = std::move(value);
      return;
    }
    string_keys.emplace(key->text, entries.size());
  }
  entries.emplace_back(std::move(key), std::move(value));
}

std::string describe(const PickleValue& value) {
  using Kind = PickleValue::Kind;
  switch (value.kind) {
    case Kind::None: return "None";
    case Kind::Bool: return value.boolean ? "True" : "False";
    case Kind::Int: return "the int " + std::to_string(value.integer);
    case Kind::Float: return "a float";
    case Kind::String: return "the string '" + value.text.substr(0, 64) + "'";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "a tuple of " + std::to_string(value.items.size());
    case Kind::List: return "a list of " + std::to_string(value.items.size());
    case Kind::Dict: return "a dict of " + std::to_string(value.entries.size());
    case Kind::Global: return "the global " + value.text;
    case Kind::Tensor: return "a tensor";
    case Kind::Storage: return "a storage";
  }
  return "?";
}

namespace {

using Kind = PickleValue::Kind;

class Unpickler {
 public:
  Unpickler(const std::string& where, const uint8_t* data, size_t size, PickleHooks& hooks)
      : where_(where), data_(data), size_(size), hooks_(hooks) {}

  PickleValuePtr run();

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    DSCHAT_THROW(FormatError, where_, ": pickle byte ", op_pos_, ": ", args...);
  }

  const uint8_t* take(size_t n) {
    if (n > size_ - pos_) fail("truncated: needs ", n, " more bytes, ", size_ - pos_, " left");
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  uint64_t read_le(size_t n) {
    const uint8_t* p = take(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
  }
  std::string read_bytes(uint64_t n) {
    if (n > size_ - pos_) fail("truncated: a ", n, "-byte string with ", size_ - pos_, " bytes left");
    return std::string(reinterpret_cast<const char*>(take(static_cast<size_t>(n))), n);
  }
  std::string read_line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    if (nl == nullptr) fail("truncated: unterminated GLOBAL line");
    size_t n = static_cast<const uint8_t*>(nl) - (data_ + pos_);
    std::string line = read_bytes(n);
    pos_ += 1;  // the newline
    return line;
  }
  // Two's complement little-endian integer of `n` bytes (LONG1/LONG4), limited to int64.
  int64_t read_long(uint64_t n) {
    if (n > 8) fail("integer of ", n, " bytes does not fit in 64 bits");
    if (n == 0) return 0;
    uint64_t v = read_le(static_cast<size_t>(n));
    if (n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }

  void push(PickleValuePtr v) { stack_.push_back(std::move(v)); }
  PickleValuePtr pop() {
    if (stack_.size() <= floor()) fail("stack underflow");
    PickleValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  PickleValuePtr& top() {
    if (stack_.size() <= floor()) fail("stack underflow");
    return stack_.back();
  }
  // Items above the innermost MARK can be popped; those below belong to enclosing frames.
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<PickleValuePtr> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleValuePtr> items(std::make_move_iterator(stack_.begin() + mark),
                                      std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return items;
  }

  PickleValuePtr scalar(Kind kind) { return PickleValue::make(kind); }
  PickleValuePtr integer(int64_t v) {
    auto p = scalar(Kind::Int);
    p->integer = v;
    return p;
  }
  PickleValuePtr string(Kind kind, std::string s) {
    auto p = scalar(kind);
    p->text = std::move(s);
    return p;
  }
  PickleValuePtr tuple(std::vector<PickleValuePtr> items) {
    auto p = scalar(Kind::Tuple);
    p->items = std::move(items);
    return p;
  }
  void memo_get(uint64_t index) {
    auto found = memo_.find(index);
    if (found == memo_.end()) fail("memo entry ", index, " was never stored");
    push(found->second);
  }
  void set_items(PickleValue& dict, std::vector<PickleValuePtr> items) {
    if (dict.kind != Kind::Dict) fail("SETITEM(S) on ", describe(dict));
    if (items.size() % 2 != 0) fail("SETITEMS with an odd number of items");
    for (size_t i = 0; i < items.size(); i += 2) dict.set_item(items[i], items[i + 1]);
  }
  void append(PickleValue& list, std::vector<PickleValuePtr> items) {
    if (list.kind != Kind::List) fail("APPEND(S) on ", describe(list));
    for (auto& item : items) list.items.push_back(std::move(item));
  }
  void op_global(std::string module, std::string name) {
    push(hooks_.global(module, name));
  }

  const std::string& where_;
  const uint8_t* data_;
  size_t size_;
  PickleHooks& hooks_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  std::vector<PickleValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleValuePtr> memo_;
};

PickleValuePtr Unpickler::run() {
  while (true) {
    op_pos_ = pos_;
    const uint8_t op = *take(1);
    switch (op) {
      case 0x80: take(1); break;  // PROTO
      case 0x95: take(8); break;  // FRAME: framing is only a read-ahead hint
      case '.': {                 // STOP
        if (!marks_.empty() || stack_.size() != 1) fail("STOP with ", stack_.size(), " values and ",
                                                         marks_.size(), " marks on the stack");
        return stack_.back();
      }
      case '(': marks_.push_back(stack_.size()); break;  // MARK
      case '0': pop(); break;                             // POP
      case '1': pop_mark(); break;                        // POP_MARK
      case '2': push(top()); break;                       // DUP
      case 'N': push(scalar(Kind::None)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE / NEWFALSE
        auto b = scalar(Kind::Bool);
        b->boolean = op == 0x88;
        push(b);
        break;
      }
      case 'J': push(integer(static_cast<int32_t>(read_le(4)))); break;  // BININT
      case 'K': push(integer(static_cast<int64_t>(read_le(1)))); break;  // BININT1
      case 'M': push(integer(static_cast<int64_t>(read_le(2)))); break;  // BININT2
      case 0x8a: push(integer(read_long(read_le(1)))); break;            // LONG1
      case 0x8b: push(integer(read_long(read_le(4)))); break;            // LONG4
      case 'G': {                                                        // BINFLOAT, big-endian
        const uint8_t* p = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
        auto f = scalar(Kind::Float);
        std::memcpy(&f->real, &bits, sizeof(bits));
        push(f);
        break;
      }
      case 'X': push(string(Kind::String, read_bytes(read_le(4)))); break;   // BINUNICODE
      case 0x8c: push(string(Kind::String, read_bytes(read_le(1)))); break;  // SHORT_BINUNICODE
      case 0x8d: push(string(Kind::String, read_bytes(read_le(8)))); break;  // BINUNICODE8
      case 'T': push(string(Kind::String, read_bytes(read_le(4)))); break;   // BINSTRING
      case 'U': push(string(Kind::String, read_bytes(read_le(1)))); break;   // SHORT_BINSTRING
      case 'B': push(string(Kind::Bytes, read_bytes(read_le(4)))); break;    // BINBYTES
      case 'C': push(string(Kind::Bytes, read_bytes(read_le(1)))); break;    // SHORT_BINBYTES
      case 0x8e: push(string(Kind::Bytes, read_bytes(read_le(8)))); break;   // BINBYTES8
      case ')': push(tuple({})); break;                                      // EMPTY_TUPLE
      case 't': push(tuple(pop_mark())); break;                              // TUPLE
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        size_t n = op - 0x84u;
        if (stack_.size() < floor() + n) fail("TUPLE", n, " with fewer than ", n, " values");
        std::vector<PickleValuePtr> items(stack_.end() - n, stack_.end());
        stack_.resize(stack_.size() - n);
        push(tuple(std::move(items)));
        break;
      }
      case ']': push(scalar(Kind::List)); break;  // EMPTY_LIST
      case 'l': {                                 // LIST
        auto list = scalar(Kind::List);
        list->items = pop_mark();
        push(list);
        break;
      }
      case '}': push(scalar(Kind::Dict)); break;  // EMPTY_DICT
      case 'd': {                                 // DICT
        auto dict = scalar(Kind::Dict);
        set_items(*dict, pop_mark());
        push(dict);
        break;
      }
      case 'a': {  // APPEND
        auto item = pop();
        append(*top(), {item});
        break;
      }
      case 'e': {  // APPENDS
        auto items = pop_mark();
        append(*top(), std::move(items));
        break;
      }
      case 's': {  // SETITEM
        auto value = pop();
        auto key = pop();
        set_items(*top(), {key, value});
        break;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        set_items(*top(), std::move(items));
        break;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        std::string module = read_line();
        op_global(module, read_line());
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        auto name = pop();
        auto module = pop();
        if (module->kind != Kind::String || name->kind != Kind::String) {
          fail("STACK_GLOBAL needs two strings, got ", describe(*module), " and ", describe(*name));
        }
        op_global(module->text, name->text);
        break;
      }
      case 'R': {  // REDUCE
        auto args = pop();
        auto callable = pop();
        if (args->kind != Kind::Tuple) fail("REDUCE arguments are ", describe(*args), ", not a tuple");
        push(hooks_.reduce(*callable, *args));
        break;
      }
      case 'b': {  // BUILD
        auto state = pop();
        hooks_.build(*top(), *state);
        break;
      }
      case 'Q': {  // BINPERSID
        auto pid = pop();
        push(hooks_.persistent_load(*pid));
        break;
      }
      case 'q': memo_[read_le(1)] = top(); break;          // BINPUT
      case 'r': memo_[read_le(4)] = top(); break;          // LONG_BINPUT
      case 0x94: memo_[memo_.size()] = top(); break;       // MEMOIZE
      case 'h': memo_get(read_le(1)); break;               // BINGET
      case 'j': memo_get(read_le(4)); break;               // LONG_BINGET
      default: {
        std::ostringstream hex;
        hex << "0x" << std::hex << std::setw(2) << std::setfill('0') << static_cast<int>(op);
        std::string printable = op >= 0x20 && op < 0x7f ? std::string(" '") + char(op) + "'" : "";
        fail("unsupported pickle opcode ", hex.str(), printable);
      }
    }
  }
}

}  // namespace

PickleValuePtr unpickle(const std::string& where, const uint8_t* data, size_t size,
                        PickleHooks& hooks) {
  return Unpickler(where, data, size, hooks).run();
}

}  // namespace io
}  // namespace dschat
