# The tuna-operator image: one static-layout binary on an empty base, run as
# the non-root UID/GID 65532 of the Helm chart (podSecurityContext). It holds
# the binary, the glibc libraries it links, the CA bundle and passwd/group
# entries: nothing else (no shell), and it writes nothing to disk, so
# readOnlyRootFilesystem works. scripts/image.sh builds the same root
# filesystem without a container registry (buildah from scratch) and checks it.
# The binary is stripped; its debug info is the one file of the `debug` target.
#
#   docker build -t code.tuna.am/tuna/tuna-operator:0.1.0 .
#   docker build --target debug -o type=local,dest=target/image .   # tuna-operator.debug

# The toolchain the project is built and tested with here.
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends cmake ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tuna-operator --bin tuna-operator \
 && scripts/image-rootfs.sh target/release/tuna-operator /rootfs /debug/tuna-operator.debug

# The stripped binary's debug info (its .gnu_debuglink names this file), for
# symbolizing a crash: not part of the image.
FROM scratch AS debug
COPY --from=build /debug/ /

FROM scratch
COPY --from=build /rootfs/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tuna-operator"]
CMD ["--help"]
