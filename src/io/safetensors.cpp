// load_safetensors / save_safetensors: see dschat/io/state_dict.h and io/safetensors_format.h.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"
#include "io/safetensors_format.h"

namespace dschat {
namespace io {
namespace {

// BOOL bytes other than 0/1 are undefined behaviour for C++ bool (and for LibTorch kernels).
void check_bool_bytes(const std::string& where, const SafetensorsEntry& entry, const uint8_t* p,
                      size_t n) {
  for (size_t i = 0; i < n; ++i) {
    DSCHAT_CHECK(p[i] <= 1, FormatError, where, ": tensor '", entry.name, "': BOOL element ", i,
                 " has byte value ", static_cast<int>(p[i]), ", expected 0 or 1");
  }
}

torch::Tensor make_tensor(const std::shared_ptr<MappedFile>& map, const SafetensorsHeader& header,
                          const SafetensorsEntry& entry) {
  const auto options = torch::TensorOptions().dtype(entry.dtype).device(torch::kCPU);
  const size_t nbytes = entry.end - entry.begin;
  if (nbytes == 0) return torch::empty(entry.shape, options);  // [shape...] with a zero dim
  uint8_t* data = map->data() + header.data_start + entry.begin;
  if (entry.dtype == torch::kBool) check_bool_bytes(map->path().string(), entry, data, nbytes);

  const size_t itemsize = c10::elementSize(entry.dtype);
  if (reinterpret_cast<uintptr_t>(data) % itemsize != 0) {
    // Misaligned for its element type (a writer that does not pad): a one-time copy.
    torch::Tensor copy = torch::empty(entry.shape, options);  // [shape...]
    std::memcpy(copy.data_ptr(), data, nbytes);
    return copy;
  }
  // Aliases the mapping; the deleter's copy of `map` keeps the file mapped while any tensor
  // (or view of one) lives.
  return torch::from_blob(data, entry.shape, [map](void*) {}, options);  // [shape...]
}

}  // namespace

TensorMap load_safetensors(const std::filesystem::path& file, Metadata* metadata) {
  std::shared_ptr<MappedFile> map = MappedFile::open(file);
  const std::string where = file.string();
  // Validates every entry before any tensor is created.
  SafetensorsHeader header = parse_safetensors_header(where, map->data(), map->size());
  TensorMap tensors;
  for (const auto& entry : header.entries) tensors.emplace(entry.name, make_tensor(map, header, entry));
  if (metadata != nullptr) *metadata = std::move(header.metadata);
  return tensors;
}

void save_safetensors(const std::filesystem::path& file, const TensorMap& tensors,
                      const Metadata& metadata) {
  const std::string where = file.string();
  std::vector<SafetensorsEntry> entries;  // name order, as the header lists them
  std::vector<const torch::Tensor*> sources;
  for (const auto& [name, tensor] : tensors) {
    DSCHAT_CHECK(name != "__metadata__", InvalidArgument, where,
                 ": '__metadata__' is reserved and cannot name a tensor");
    DSCHAT_CHECK(tensor.defined(), InvalidArgument, where, ": tensor '", name, "' is undefined");
    DSCHAT_CHECK(!safetensors_dtype_name(tensor.scalar_type()).empty(), InvalidArgument, where,
                 ": tensor '", name, "' has dtype ", tensor.scalar_type(),
                 " which safetensors cannot store (supported: ", safetensors_supported_dtypes(), ")");
    DSCHAT_CHECK(tensor.layout() == torch::kStrided, InvalidArgument, where, ": tensor '", name,
                 "' is not a dense (strided) tensor");
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = tensor.scalar_type();
    entry.shape = tensor.sizes().vec();
    entry.end = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();  // size for now
    entries.push_back(std::move(entry));
    sources.push_back(&tensor);
  }
  // Data order: larger elements first (then by name), as the reference writer does. The data
  // section starts 8-aligned, so every tensor starts aligned to its element size and loads
  // zero-copy; the offsets stay contiguous.
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return c10::elementSize(entries[a].dtype) > c10::elementSize(entries[b].dtype);
  });
  uint64_t offset = 0;
  for (size_t i : order) {
    entries[i].begin = offset;
    entries[i].end += offset;
    offset = entries[i].end;
  }

  std::string header;
  try {
    header = build_safetensors_header(entries, metadata);
  } catch (const nlohmann::json::exception& e) {
    DSCHAT_THROW(InvalidArgument, where, ": a tensor name or metadata string is not valid UTF-8: ",
                 e.what());
  }
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));

  AtomicFileWriter writer(file);
  writer.write(length, sizeof(length));
  writer.write(header.data(), header.size());
  for (size_t i : order) {
    // One tensor at a time: a device-resident model is never copied to the host all at once.
    torch::Tensor t = sources[i]->detach().to(torch::kCPU).contiguous();  // [shape...]
    if (t.nbytes() > 0) writer.write(t.data_ptr(), t.nbytes());
  }
  writer.commit();
}

}  // namespace io
}  // namespace dschat
