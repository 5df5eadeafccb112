# vfio-dra-plugin image for people with Docker: built on Debian 12 from this repository, run on
# Debian 12 slim with only the shared libraries the binary links. Without Docker, hack/image.sh
# builds the image from Debian packages (CI runs it in containerd on its VM node). The runtime-packages block
# below is the one package list of both: image.sh reads it, and
# test/image/check_runtime_packages.py keeps it in step with `ldd`.
#
#   docker build -t <registry>/vfio-dra-plugin:0.1.0 .
#
# then set that image in deploy/daemonset (kustomize `images:`, or edit daemonset.yaml).

FROM debian:12 AS build
WORKDIR /src
COPY hack/install-deps.sh hack/install-deps.sh
RUN ./hack/install-deps.sh --build-only && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVFIO_DRA_BUILD_TESTS=OFF \
      -DVFIO_DRA_WERROR=ON \
 && cmake --build /build --target vfio-dra-plugin --parallel \
 && strip --strip-debug -o /vfio-dra-plugin /build/src/vfio-dra-plugin

FROM debian:12-slim AS runtime
# runtime-packages-begin
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libcpp-httplib0.11 \
      libmnl0 \
      libpci3 \
      libprometheus-cpp-core1.0 \
      libssl3 \
      libudev1 \
      pci.ids \
 && rm -rf /var/lib/apt/lists/*
# runtime-packages-end
COPY --from=build /vfio-dra-plugin /usr/bin/vfio-dra-plugin
ENTRYPOINT ["/usr/bin/vfio-dra-plugin"]
CMD ["serve"]
