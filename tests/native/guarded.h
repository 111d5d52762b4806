// Tensors placed inside canary guard bands (OPS §8 C3), as named byte buffers so one comparison covers every op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kl3_native {

// One argument tensor: its name (as in OPS.md), element size and contents.
struct Tensor {
  std::string name;
  std::size_t elem = 1;
  std::vector<unsigned char> bytes;

  template <typename T>
  static Tensor of(const std::string& name, const std::vector<T>& values) {
    Tensor t;
    t.name = name;
    t.elem = sizeof(T);
    t.bytes.resize(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
    return t;
  }
};

// A copy of a set of tensors, each surrounded by `kBand` canary bytes on both sides.
class GuardedSet {
 public:
  static constexpr std::size_t kBand = 64;
  static constexpr unsigned char kCanary = 0x5C;

  explicit GuardedSet(const std::vector<Tensor>& tensors) : tensors_(tensors) {
    for (const Tensor& t : tensors_) {
      std::vector<unsigned char> buf(kBand + t.bytes.size() + kBand, kCanary);
      if (!t.bytes.empty()) std::memcpy(buf.data() + kBand, t.bytes.data(), t.bytes.size());
      buffers_.push_back(buf);
    }
  }

  template <typename T>
  T* ptr(std::size_t i) {
    return reinterpret_cast<T*>(buffers_[i].data() + kBand);
  }

  std::size_t size() const { return tensors_.size(); }
  const std::string& name(std::size_t i) const { return tensors_[i].name; }

  // "" when intact, else the name of the first tensor whose band changed.
  std::string broken_canary() const {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      const std::vector<unsigned char>& b = buffers_[i];
      for (std::size_t k = 0; k < kBand; ++k) {
        if (b[k] != kCanary || b[b.size() - 1 - k] != kCanary) return tensors_[i].name;
      }
    }
    return "";
  }

  // "" when every tensor is byte-identical to `other`, else "<tensor>[<element>]".
  std::string first_difference(const GuardedSet& other) const {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      const std::vector<unsigned char>& a = buffers_[i];
      const std::vector<unsigned char>& b = other.buffers_[i];
      for (std::size_t k = kBand; k + kBand < a.size(); ++k) {
        if (a[k] != b[k]) return tensors_[i].name + "[" + std::to_string((k - kBand) / tensors_[i].elem) + "]";
      }
    }
    return "";
  }

 private:
  std::vector<Tensor> tensors_;
  std::vector<std::vector<unsigned char> > buffers_;
};

}  // namespace kl3_native
