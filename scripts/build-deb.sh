#!/usr/bin/env bash
# Builds the Debian package cri-imaged_VERSION_ARCH.deb with dpkg-deb from a staged tree (no tool
# beyond Debian's own): the binary at /usr/bin/cri-imaged (stripped), the units of deploy/systemd
# in /lib/systemd/system with ExecStart at /usr/bin/cri-imaged, the default config at
# /etc/cri-imaged/config.yaml (a conffile), the README and copyright in
# /usr/share/doc/cri-imaged, and the maintainer scripts and control file of packaging/deb
# (Depends from dpkg-shlibdeps, the version from Cargo.toml).
#
# Usage: scripts/build-deb.sh [--binary PATH] [--out DIR]
#   --binary PATH  the cri-imaged to package (default: the release build, built if missing); it
#                  must be a build of Cargo.toml's version
#   --out DIR      where the .deb goes (default: cargo's target dir, under debian/)
# Prints the .deb's path. Needs dpkg-dev (dpkg-shlibdeps) and binutils (strip); not root.
set -euo pipefail
umask 022

binary=""
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "build-deb: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done

die() { echo "build-deb: $*" >&2; exit 1; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command -v dpkg-deb >/dev/null || die "dpkg-deb is not installed (is this Debian?)"
command -v dpkg-shlibdeps >/dev/null || die "dpkg-shlibdeps is not installed (scripts/install-deps.sh installs dpkg-dev)"
command -v strip >/dev/null || die "strip is not installed (binutils)"

target_dir() {
    cargo metadata --format-version 1 --no-deps --manifest-path "$repo/Cargo.toml" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])'
}
if [ -z "$binary" ]; then
    binary="$(target_dir)/release/cri-imaged"
    echo "build-deb: cargo build --release --locked --bin cri-imaged" >&2
    cargo build --release --locked --bin cri-imaged --manifest-path "$repo/Cargo.toml"
fi
[ -x "$binary" ] || die "$binary is not an executable"
out=${out:-$(target_dir)/debian}

# The [package] version of Cargo.toml; the binary must be a build of it (not a stale one).
version=$(awk -F'"' '/^\[/ { in_package = ($0 == "[package]") } in_package && /^version *=/ { print $2; exit }' "$repo/Cargo.toml")
[ -n "$version" ] || die "no version in $repo/Cargo.toml"
built=$("$binary" --version | awk '{ print $2 }')
[ "$built" = "$version" ] || die "$binary is version $built, Cargo.toml says $version (rebuild it)"
# A semver pre-release (0.2.0-rc.1) sorts before its release in Debian only as 0.2.0~rc.1.
deb_version=${version/-/\~}
arch=$(dpkg --print-architecture)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Under debian/PACKAGE, where dpkg-shlibdeps expects a package's files.
root="$work/debian/cri-imaged"

install -D -m 0755 "$binary" "$root/usr/bin/cri-imaged"
# As dh_strip does; the symbols would be most of a debug build's size.
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/cri-imaged"

# The units with the binary at /usr/bin, and the by-hand "# Install: …" steps of their opening
# comment (the lines indented under it too) replaced by what the package did.
install -d "$root/lib/systemd/system"
for unit in cri-imaged.service cri-imaged.socket; do
    awk '/^\[/ { in_header = 0 }
        NR == 1 { in_header = 1 }
        in_header && /^# Install:/ {
            print "# Installed by the cri-imaged package, which made the cri-imaged group and enabled"
            print "# cri-imaged.socket; change settings with `systemctl edit`, not here (upgrades replace this file)."
            skipping = 1; next
        }
        skipping && /^#   / { next }
        { skipping = 0; print }' "$repo/deploy/systemd/$unit" |
        sed 's|/usr/local/bin/cri-imaged|/usr/bin/cri-imaged|g' >"$root/lib/systemd/system/$unit"
    chmod 0644 "$root/lib/systemd/system/$unit"
    ! grep -q /usr/local/bin "$root/lib/systemd/system/$unit" ||
        die "deploy/systemd/$unit still names /usr/local/bin after the rewrite: update this script"
done
grep -q '^ExecStart=/usr/bin/cri-imaged serve --config /etc/cri-imaged/config.yaml$' "$root/lib/systemd/system/cri-imaged.service" ||
    die "deploy/systemd/cri-imaged.service: no ExecStart=/usr/local/bin/cri-imaged serve --config /etc/cri-imaged/config.yaml"

# The documented defaults, a conffile: dpkg keeps an admin's edits on upgrade and on removal.
install -D -m 0644 "$repo/deploy/cri-imaged.yaml" "$root/etc/cri-imaged/config.yaml"

docs="$root/usr/share/doc/cri-imaged"
install -D -m 0644 "$repo/README.md" "$docs/README.md"
gzip -9n "$docs/README.md"
install -m 0644 "$repo/packaging/deb/copyright" "$docs/copyright"

install -d "$root/DEBIAN"
for script in postinst prerm postrm; do
    install -m 0755 "$repo/packaging/deb/$script" "$root/DEBIAN/$script"
done
echo /etc/cri-imaged/config.yaml >"$root/DEBIAN/conffiles"
chmod 0644 "$root/DEBIAN/conffiles"

# What the binary links against, with the versions its symbols need (libc6, libgcc-s1).
printf 'Source: cri-imaged\n\nPackage: cri-imaged\nArchitecture: any\n' >"$work/debian/control"
shlibs=$(cd "$work" && dpkg-shlibdeps -O debian/cri-imaged/usr/bin/cri-imaged | sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || die "dpkg-shlibdeps found no dependency of $binary"
installed_size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s|@VERSION@|$deb_version|" -e "s|@ARCH@|$arch|" -e "s|@INSTALLED_SIZE@|$installed_size|" \
    -e "s|@SHLIBS_DEPENDS@|$shlibs|" "$repo/packaging/deb/control" >"$root/DEBIAN/control"
! grep -q '@[A-Z_]*@' "$root/DEBIAN/control" || die "packaging/deb/control: a placeholder was left"

# The same inputs give the same package: every time stamp is the last commit's.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}
find "$root" -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$out"
deb="$out/cri-imaged_${deb_version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "build-deb: built $deb" >&2
echo "$deb"
