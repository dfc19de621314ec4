# cri-imaged as a container image (for the DaemonSet in deploy/kubernetes).
#
# Build it with scripts/build-image.sh, which builds the binary with cargo outside the image and
# stages this build context; the image is FROM scratch, so it builds offline (buildah bud
# --isolation chroot --storage-driver vfs) and holds only what runs:
#   rootfs/usr/local/bin/cri-imaged  the daemon (the entrypoint)
#   rootfs/lib*/...                  its dynamic loader and the libraries `ldd` names (glibc's
#                                    libc, libm, libgcc_s), copied from the build machine
#   rootfs/bin/busybox               static busybox: the shell of the DaemonSet's exec probes
#   rootfs/usr/local/bin/grpcurl     static grpcurl: the probes' grpc.health.v1 client on the
#                                    unix socket (Kubernetes' own grpc probe speaks TCP only)
FROM scratch
COPY rootfs/ /
ENTRYPOINT ["/usr/local/bin/cri-imaged"]
CMD ["serve"]
