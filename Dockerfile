# cri-imaged as a container image (for the DaemonSet in deploy/kubernetes).
#
# Build it with scripts/build-image.sh, which builds the binary with cargo outside the image and
# stages this build context; the image is FROM scratch, so it builds offline (buildah bud
# --isolation chroot --storage-driver vfs) and holds only what runs:
#   rootfs/usr/local/bin/cri-imaged  the daemon (the entrypoint)
#   rootfs/lib*/...                  its dynamic loader and the libraries `ldd` names (glibc's
#                                    libc, libm, libgcc_s), copied from the build machine
# No shell and no other program: the DaemonSet's probes are the kubelet's own HTTP GETs.
FROM scratch
COPY rootfs/ /
ENTRYPOINT ["/usr/local/bin/cri-imaged"]
CMD ["serve"]
