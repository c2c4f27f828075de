#pragma once
// GPT-2's byte-level alphabet: every byte is shown as one printable code point (printable Latin-1
// bytes as themselves, the other 68 bytes as U+0100..U+0143), so BPE runs over strings that
// contain no spaces or control characters and can represent any byte sequence.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dschat {
namespace tokenizer {

/// The code point that stands for byte `b`.
char32_t byte_to_char(uint8_t b);

/// Appends the byte-level form of `bytes` (each byte as the UTF-8 of its code point) to `out`.
void append_byte_level(std::string_view bytes, std::string& out);

/// The bytes of `token` when every code point of it is in the byte-level alphabet; otherwise the
/// token's own UTF-8 (as `tokenizers`' ByteLevel decoder does for added tokens such as "<pad>"
/// that contain characters like ' ').
void append_byte_level_decoded(std::string_view token, std::string& out);

}  // namespace tokenizer
}  // namespace dschat
