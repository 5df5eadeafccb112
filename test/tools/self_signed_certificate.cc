#include "self_signed_certificate.h"

#include <cstdlib>

namespace vfio_dra::testing {

Status MakeSelfSignedCertificate(const std::string& dir, const std::string& name,
                                 const std::string& alt_names) {
  // The command goes through the shell: each argument is single-quoted, so none may hold a quote.
  for (const std::string* part : {&dir, &name, &alt_names}) {
    if (part->find('\'') != std::string::npos) {
      return MakeError(ErrorKind::kInvalidArgument,
                       "cannot make a certificate for \"" + *part + "\": it holds a single quote");
    }
  }
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj '/CN=" + name +
      "' -addext 'subjectAltName=" + alt_names + "' -keyout '" + dir + "/" + name + ".key' -out '" +
      dir + "/" + name + ".crt' 2>/dev/null";
  if (std::system(command.c_str()) != 0) {
    return MakeError(ErrorKind::kFailedPrecondition,
                     "could not make a certificate with `" + command +
                         "` (is openssl installed? hack/install-deps.sh installs it)");
  }
  return Status::Ok();
}

}  // namespace vfio_dra::testing
