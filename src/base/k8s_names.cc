#include "base/k8s_names.h"

namespace vfio_dra {
namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

}  // namespace

bool IsDnsLabel(const std::string& value) {
  if (value.empty() || value.size() > 63) return false;
  if (!IsLowerAlnum(value.front()) || !IsLowerAlnum(value.back())) return false;
  for (char c : value) {
    if (!IsLowerAlnum(c) && c != '-') return false;
  }
  return true;
}

bool IsDnsSubdomain(const std::string& value) {
  if (value.empty() || value.size() > 253) return false;
  size_t start = 0;
  while (true) {
    const size_t dot = value.find('.', start);
    const std::string part = value.substr(start, dot == std::string::npos ? dot : dot - start);
    if (part.empty()) return false;
    if (!IsLowerAlnum(part.front()) || !IsLowerAlnum(part.back())) return false;
    for (char c : part) {
      if (!IsLowerAlnum(c) && c != '-') return false;
    }
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

bool IsObjectUid(const std::string& value) {
  if (value.empty() || value.size() > 128) return false;
  for (char c : value) {
    if (!IsLowerAlnum(c) && !(c >= 'A' && c <= 'Z') && c != '-') return false;
  }
  return true;
}

}  // namespace vfio_dra
