#include "self_signed_certificate.h"

#include <cstdlib>

namespace vfio_dra::testing {

Status MakeSelfSignedCertificate(const std::string& dir, const std::string& name,
                                 const std::string& alt_names) {
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=" + name +
      " -addext subjectAltName=" + alt_names + " -keyout " + dir + "/" + name + ".key -out " + dir +
      "/" + name + ".crt 2>/dev/null";
  if (std::system(command.c_str()) != 0) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "could not make a certificate with `" + command +
                         "` (is openssl installed? hack/install-deps.sh installs it)");
  }
  return Status::Ok();
}

}  // namespace vfio_dra::testing
