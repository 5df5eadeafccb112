// SliceDigest: what the reconciler keeps of a server slice's content between syncs instead of the
// content itself. With 1,000 published devices the decoded contents cost over a megabyte of the
// idle daemon's heap; two digests cost 64 bytes a slice. Invariant: two contents have equal
// content digests exactly when they are equal field by field (SliceContent's operator==), and
// equal name digests exactly when they offer the same device and counter-set names, SHA-256
// collisions aside. Digesting builds no JSON: it runs on every slice the server echoes.
#pragma once

#include "base/sha256.h"
#include "slicepublisher/slice_model.h"

namespace vfio_dra::slicepublisher {

struct SliceDigest {
  // Of the sorted device and counter-set names: a desired slice rewrites the existing slice
  // that offers the same names.
  Sha256 names{};
  // Of every field of the content, in order: equal means nothing to write.
  Sha256 content{};
  bool operator==(const SliceDigest&) const = default;
};

SliceDigest DigestOf(const SliceContent& content);

}  // namespace vfio_dra::slicepublisher
