#pragma once
// How the process's C allocator treats freed host memory. A CPU training loop allocates the same
// large tensors (activations, logits, gradients) every step; glibc's defaults hand large blocks
// back to the kernel (munmap, heap trimming) when they are freed, so the next step faults in and
// zeroes fresh pages for each of them. Measured on step 3 of the CPU benchmark (docs/benchmarks.md),
// keeping them made dschat's iteration 10-17% faster; transformers in Python, whose heap stays
// fragmented by small objects, barely changed.
//
// dschat's CLI and benchmarks call retain_freed_host_memory() at start. A program that links
// libdschat decides for itself: the library never changes process-wide allocator settings.

namespace dschat {
namespace core {

/// glibc: blocks up to the largest mmap threshold glibc accepts come from the heap, and the heap
/// is neither trimmed nor grown by less than 256 MiB at a time, so freed memory is reused
/// without page faults. The resident size then stays near its peak (as a caching allocator's
/// does). Returns false where the C library has no such settings (nothing is changed then).
bool retain_freed_host_memory();

}  // namespace core
}  // namespace dschat
