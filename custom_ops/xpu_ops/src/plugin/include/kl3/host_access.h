// Host-side element access shared by the CPU paths of the wrappers.
#pragma once

namespace kl3 {

// Boolean inputs are read as "nonzero means true" (OPS §2.1). Reading the byte as unsigned char keeps a stored
// value other than 0/1 well defined (loading it as `bool` is undefined behaviour).
inline bool read_flag(const bool* flags, long long i) {
  return reinterpret_cast<const unsigned char*>(flags)[i] != 0;
}

}  // namespace kl3
