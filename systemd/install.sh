#!/usr/bin/env bash
# Installs pi0d as a systemd service: the steps listed at the top of systemd/pi0d.service.
#
#   sudo systemd/install.sh --model /path/to/your-pi0-checkpoint
#   systemd/install.sh --root /tmp/pi0d-root --binary target/debug/pi0d --model models/tiny-pi0
#
# --root DIR     install under DIR instead of / (a staging tree, or a trial without root): the
#                absolute paths in the installed /etc/pi0d/pi0d.toml then point under DIR, so
#                `pi0d check --config DIR/etc/pi0d/pi0d.toml` reads the installed files; the
#                unit is installed as it is (it names the final paths). No user is created and
#                systemd is not told.
# --binary PATH  the pi0d binary (default target/release/pi0d: `cargo build --release`)
# --model DIR    a checkpoint directory, copied to /opt/pi0d/models/<its name> and named as
#                policy.checkpoint in the installed config. Without it the config keeps its
#                placeholder and `pi0d check` names policy.checkpoint until you set it. (The
#                bundled models/tiny-pi0 has random weights: for a trial, never on an arm.)
#
# An existing /etc/pi0d/pi0d.toml, /etc/pi0d/pi0d.env or installed model is kept (they are
# yours to edit); the binary, the unit and the URDF are replaced. The service is not enabled:
# check the config first (the last lines printed say how).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
root=/
binary="$repo/target/release/pi0d"
model=""

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit "$1"
}

die() {
  echo "install.sh: $*" >&2
  exit 1
}

while [ $# -gt 0 ]; do
  case "$1" in
    --root) [ $# -ge 2 ] || die "--root needs a directory"; root=$2; shift 2 ;;
    --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
    --model) [ $# -ge 2 ] || die "--model needs a checkpoint directory"; model=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done

[ -n "$root" ] || die "--root: empty"
mkdir -p "$root" || die "--root $root: cannot create it"
root="$(cd "$root" && pwd)"
# DIR prefix of every installed path ("" for /).
p="${root%/}"

[ -f "$binary" ] && [ -x "$binary" ] \
  || die "--binary $binary: no executable there (build it: cargo build --release, or pass --binary PATH)"
if [ -n "$model" ]; then
  [ -d "$model" ] || die "--model $model: not a directory (a checkpoint directory is expected)"
  model="$(cd "$model" && pwd)"
  model_name="$(basename "$model")"
  [[ "$model_name" =~ ^[A-Za-z0-9._-]+$ ]] \
    || die "--model $model: its name '$model_name' must be letters, digits, '.', '_' or '-' (it goes into the config)"
fi
if [ -z "$p" ] && [ "$(id -u)" -ne 0 ]; then
  die "installing into / needs root: run it with sudo, or pass --root DIR"
fi

note() { echo "  $*"; }

# 1. The user the service runs as: only for a real install, by root.
if [ -n "$p" ]; then
  note "user pi0d: not created under --root $root (a real install creates it)"
elif id pi0d >/dev/null 2>&1; then
  note "user pi0d: exists"
else
  useradd --system --no-create-home --shell /usr/sbin/nologin pi0d
  note "user pi0d: created"
fi

# 2. The binary, the directories, the URDF.
install -D -m 755 "$binary" "$p/usr/local/bin/pi0d"
note "binary: $p/usr/local/bin/pi0d"
install -d "$p/etc/pi0d" "$p/opt/pi0d/models" "$p/opt/pi0d/urdf" "$p/etc/systemd/system"
# The state directory (fault latch, recordings): systemd's StateDirectory= also creates it and
# hands it to the service's user; made here so [record] can point into it before a first start.
if [ -z "$p" ]; then
  install -d -o pi0d -g pi0d -m 750 /var/lib/pi0d /var/lib/pi0d/recordings
else
  install -d -m 750 "$p/var/lib/pi0d" "$p/var/lib/pi0d/recordings"
fi
note "state: $p/var/lib/pi0d (recordings in $p/var/lib/pi0d/recordings)"
install -m 644 "$repo/urdf/ur5e.urdf" "$p/opt/pi0d/urdf/ur5e.urdf"
note "URDF: $p/opt/pi0d/urdf/ur5e.urdf"

# 3. The model.
if [ -n "$model" ]; then
  if [ -e "$p/opt/pi0d/models/$model_name" ]; then
    note "model: $p/opt/pi0d/models/$model_name exists: kept (remove it to install it again)"
  else
    cp -R "$model" "$p/opt/pi0d/models/$model_name"
    chmod -R a+rX,go-w "$p/opt/pi0d/models/$model_name"
    note "model: $p/opt/pi0d/models/$model_name"
  fi
fi

# sed replacement text: \, | and & stand for themselves.
sed_escape() { printf '%s' "$1" | sed 's/[\\|&]/\\&/g'; }

# 4. The configuration and the environment file: kept when present.
config="$p/etc/pi0d/pi0d.toml"
if [ -e "$config" ]; then
  note "config: $config exists: kept (systemd/pi0d.toml.example is the new example)"
else
  tmp="$(mktemp "$p/etc/pi0d/.pi0d.toml.XXXXXX")"
  cp "$repo/systemd/pi0d.toml.example" "$tmp"
  if [ -n "$p" ]; then
    # Absolute paths (quoted values: urdf, checkpoint, record.path) to the files under DIR.
    e="$(sed_escape "$p")"
    for d in opt/pi0d var/lib/pi0d etc/pi0d; do
      sed -i "s|\"/$d/|\"$e/$d/|g" "$tmp"
    done
  fi
  if [ -n "$model" ]; then
    e="$(sed_escape "$p/opt/pi0d/models/$model_name")"
    sed -i "s|^checkpoint = .*|checkpoint = \"$e\"|" "$tmp"
  fi
  chmod 644 "$tmp"
  mv "$tmp" "$config"
  note "config: $config (from systemd/pi0d.toml.example; edit it)"
fi
if [ -e "$p/etc/pi0d/pi0d.env" ]; then
  note "environment: $p/etc/pi0d/pi0d.env exists: kept"
else
  install -m 644 "$repo/systemd/pi0d.env.example" "$p/etc/pi0d/pi0d.env"
  note "environment: $p/etc/pi0d/pi0d.env (ROS_DOMAIN_ID, RMW)"
fi

# 5. The unit.
install -m 644 "$repo/systemd/pi0d.service" "$p/etc/systemd/system/pi0d.service"
note "unit: $p/etc/systemd/system/pi0d.service"
if [ -z "$p" ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  note "systemd: reloaded"
else
  note "systemd: not told (not a real install, or systemd not running)"
fi

echo "Next:"
if [ -z "$model" ]; then
  echo "  copy your checkpoint to $p/opt/pi0d/models/ and set policy.checkpoint in $config"
fi
if [ -z "$p" ]; then
  echo "  edit $config (robot, topics, limits), then"
  echo "  sudo -u pi0d pi0d check --config $config"
  echo "  sudo systemctl enable --now pi0d"
else
  echo "  $p/usr/local/bin/pi0d check --config $config"
fi
