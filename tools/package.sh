#!/usr/bin/env bash
# Builds pi0d's Debian package for amd64 or arm64: the binary, the systemd unit, the launch
# files, example configurations, URDFs, the bundled models and the docs, under the paths
# docs/deployment.md uses; installing it creates the user `pi0d` and enables nothing.
#
#   tools/package.sh --arch arm64 --build          # cross-compiles (release) on x86, then packages
#   tools/package.sh --arch amd64 --binary target/release/pi0d [--out DIR]
#
# --arch amd64|arm64  the package's architecture (the binary must be built for it)
# --build             cargo build --release for the architecture first (arm64: cross-compiled
#                     with Debian's gcc-aarch64-linux-gnu, as tools/test_aarch64.sh installs it),
#                     with the features a board uses: onnx (ONNX Runtime / CANN provider),
#                     zenoh (rmw_zenoh), tls (wss://)
# --binary PATH       a pi0d binary built for --arch (default: the --build output)
# --out DIR           where the .deb goes (default target/debian)
# --compress xz|gzip|none  the package's compression (default xz)
# --check             then run the packaged binary (arm64: under qemu-user): `pi0d check` on the
#                     simulated arm's config, 5 s of the simulated arm (chunks executed, no limit
#                     violation), and `pi0d infer` of a golden case against lerobot's actions
#                     through the CPU kernels (NEON on arm64)
#
# The package's libc6 dependency is the newest GLIBC_ symbol version the binary requires (read
# from its dynamic symbols), printed at the end: the oldest system it runs on.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
arch=""
build=0
binary=""
out="$repo/target/debian"
compress=xz
check=0

die() {
  echo "package.sh: $*" >&2
  exit 1
}

while [ $# -gt 0 ]; do
  case "$1" in
    --arch) [ $# -ge 2 ] || die "--arch needs amd64 or arm64"; arch=$2; shift 2 ;;
    --build) build=1; shift ;;
    --check) check=1; shift ;;
    --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
    --compress) [ $# -ge 2 ] || die "--compress needs xz, gzip or none"; compress=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

case "$arch" in
  amd64) triple=x86_64-unknown-linux-gnu; objdump=objdump; strip=strip; machine="X86-64" ;;
  arm64)
    triple=aarch64-unknown-linux-gnu; objdump=aarch64-linux-gnu-objdump
    strip=aarch64-linux-gnu-strip; machine="AArch64" ;;
  *) die "--arch must be amd64 or arm64, not '${arch}'" ;;
esac

if [ "$build" -eq 1 ]; then
  if [ "$arch" = arm64 ]; then
    rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"
    command -v aarch64-linux-gnu-gcc >/dev/null \
      || die "aarch64-linux-gnu-gcc is missing: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
  fi
  (cd "$repo" && cargo build --release --locked --target "$triple" --features onnx,zenoh,tls)
  [ -n "$binary" ] || binary="$repo/target/$triple/release/pi0d"
fi
[ -n "$binary" ] || die "no binary: pass --binary PATH or --build"
[ -f "$binary" ] && [ -x "$binary" ] || die "--binary $binary: no executable there"
command -v dpkg-deb >/dev/null || die "dpkg-deb is missing (apt-get install dpkg)"
command -v "$objdump" >/dev/null || die "$objdump is missing (binutils for $arch)"
command -v "$strip" >/dev/null || die "$strip is missing (binutils for $arch)"

# The binary is for the package's architecture.
file_machine="$(readelf -h "$binary" | sed -n 's/^ *Machine: *//p')"
case "$file_machine" in
  *"$machine"*) ;;
  *) die "--binary $binary is built for '$file_machine', not $arch" ;;
esac

# The oldest glibc it runs on: its newest GLIBC_ symbol version.
glibc="$("$objdump" -T "$binary" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1)"
[ -n "$glibc" ] || die "$binary requires no GLIBC_ symbol: not a glibc binary?"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)"

stage="$(mktemp -d "${TMPDIR:-/tmp}/pi0d-deb.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
r="$stage/root"

install -D -m 755 "$binary" "$r/usr/bin/pi0d"
# Without its debug information (a release build's is two thirds of it); symbols stay, so a
# backtrace still names functions.
"$strip" --strip-debug "$r/usr/bin/pi0d"
# The unit as docs/deployment.md describes it, the binary where a package puts it.
install -d "$r/lib/systemd/system"
sed 's|/usr/local/bin/pi0d|/usr/bin/pi0d|g' "$repo/systemd/pi0d.service" >"$r/lib/systemd/system/pi0d.service"
chmod 644 "$r/lib/systemd/system/pi0d.service"
install -D -m 644 "$repo/systemd/pi0d.toml.example" "$r/etc/pi0d/pi0d.toml"
install -D -m 644 "$repo/systemd/pi0d.env.example" "$r/etc/pi0d/pi0d.env"
install -D -m 644 "$repo/urdf/ur5e.urdf" "$r/opt/pi0d/urdf/ur5e.urdf"
install -d "$r/opt/pi0d/models"
# Examples, laid out as in the repository so their relative paths hold.
share="$r/usr/share/pi0d"
install -d "$share/config/zenoh" "$share/launch" "$share/urdf" "$share/models"
install -m 644 "$repo"/config/*.toml "$share/config/"
install -m 644 "$repo"/config/zenoh/*.json5 "$share/config/zenoh/"
install -m 644 "$repo"/launch/* "$share/launch/"
install -m 644 "$repo"/urdf/*.urdf "$share/urdf/"
for m in sim-reach tiny-pi0; do
  cp -R "$repo/models/$m" "$share/models/$m"
done
chmod -R a+rX,go-w "$share"
doc="$r/usr/share/doc/pi0d"
install -d "$doc/docs"
install -m 644 "$repo/README.md" "$doc/README.md"
install -m 644 "$repo"/docs/*.md "$doc/docs/"
printf 'pi0d\nLicense: Apache-2.0\n' >"$doc/copyright"

install -d "$r/DEBIAN"
size_kb="$(du -sk "$r" | cut -f1)"
cat >"$r/DEBIAN/control" <<EOF
Package: pi0d
Version: $version
Architecture: $arch
Maintainer: pi0d <pi0d@localhost>
Depends: libc6 (>= $glibc), adduser
Installed-Size: $size_kb
Section: misc
Priority: optional
Homepage: https://github.com/pi0d/pi0d
Description: drives a robot arm with the pi0 / pi0.5 vision-language-action policy
 A daemon that subscribes to a robot's cameras and joint states over ROS 2, runs pi0 or pi0.5
 locally (CPU, ONNX Runtime, Ascend NPU through AscendCL) or on a policy server, and sends
 time-aligned, safety-governed commands to ros2_control. The service is installed, not enabled:
 edit /etc/pi0d/pi0d.toml, run "pi0d check --config /etc/pi0d/pi0d.toml", then enable it.
EOF
printf '/etc/pi0d/pi0d.toml\n/etc/pi0d/pi0d.env\n' >"$r/DEBIAN/conffiles"
cat >"$r/DEBIAN/postinst" <<'EOF'
#!/bin/sh
# The service's user and its state directory; the service is not enabled or started.
set -e
if [ "$1" = configure ]; then
  if ! getent passwd pi0d >/dev/null; then
    adduser --system --group --no-create-home --home /var/lib/pi0d --shell /usr/sbin/nologin pi0d
  fi
  install -d -o pi0d -g pi0d -m 750 /var/lib/pi0d /var/lib/pi0d/recordings
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
  fi
fi
exit 0
EOF
cat >"$r/DEBIAN/prerm" <<'EOF'
#!/bin/sh
# A removed package leaves no service running (it brings the arm to rest on SIGTERM).
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  systemctl stop pi0d.service 2>/dev/null || true
fi
exit 0
EOF
chmod 755 "$r/DEBIAN/postinst" "$r/DEBIAN/prerm"

mkdir -p "$out"
deb="$out/pi0d_${version}_${arch}.deb"
case "$compress" in xz | gzip | none) ;; *) die "--compress must be xz, gzip or none" ;; esac
dpkg-deb --root-owner-group "-Z$compress" --build "$r" "$deb" >/dev/null
echo "package: $deb"
echo "glibc: $glibc or newer (libc6 >= $glibc)"

[ "$check" -eq 1 ] || exit 0
# The packaged binary, as installed, on this machine.
run=("$r/usr/bin/pi0d")
if [ "$arch" = arm64 ] && [ "$(uname -m)" != aarch64 ]; then
  command -v qemu-aarch64 >/dev/null || die "--check on arm64 needs qemu-user (apt-get install qemu-user)"
  run=(qemu-aarch64 -L /usr/aarch64-linux-gnu "$r/usr/bin/pi0d")
fi
work="$stage/check"
mkdir -p "$work"
echo "check: pi0d check on the simulated arm's config"
"${run[@]}" check --config "$r/usr/share/pi0d/config/sim.toml" >"$work/check.log" 2>&1 \
  || { cat "$work/check.log"; die "pi0d check failed"; }
echo "check: 5 s of the simulated arm"
"${run[@]}" run --quiet --config "$r/usr/share/pi0d/config/sim.toml" --duration 5 \
  --summary "$work/summary.json" >"$work/run.log" 2>&1 || { cat "$work/run.log"; die "pi0d run failed"; }
python3 - "$work/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"  chunks accepted {s['chunks_accepted']}, limit violations {s['limit_violations']}, exit {s['exit']}")
assert s["chunks_accepted"] >= 1 and s["limit_violations"] == 0 and s["exit"] == "clean", s
PY
case_dir="$repo/tests/fixtures/cases/pi0_f32_1cam_short"
echo "check: pi0d infer of a golden case against lerobot's actions"
"${run[@]}" infer --checkpoint "$repo/tests/fixtures/pi0_float32" --inputs "$case_dir/inputs.safetensors" \
  --output "$work/actions.safetensors" >"$work/infer.log" 2>&1 || { cat "$work/infer.log"; die "pi0d infer failed"; }
python3 - "$work/actions.safetensors" "$case_dir/expected.safetensors" <<'PY'
import json, struct, sys
def actions(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + n])["actions"]
    start, end = t["data_offsets"]
    data = b[8 + n + start:8 + n + end]
    return struct.unpack(f"<{len(data) // 4}f", data)
got, want = actions(sys.argv[1]), actions(sys.argv[2])
err = max(abs(a - b) for a, b in zip(got, want))
print(f"  max abs error against lerobot {err:.1e}")
assert len(got) == len(want) and err <= 1e-4, err
PY
echo "check: passed"
