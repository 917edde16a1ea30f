#!/usr/bin/env bash
# Let this machine run other platforms' binaries (linux/arm64 on an amd64 host, linux/amd64 on an
# arm64 one) under qemu user emulation, for `envbuild base bootstrap --platform ...` and builds
# with `--platform`:
#   - Debian's qemu-user-static (static interpreters, so they work inside chroots and containers)
#   - binfmt_misc mounted at /proc/sys/fs/binfmt_misc
#   - a qemu-<machine> handler registered with the F (fix-binary) flag: the kernel opens the
#     interpreter once, at registration, so a container or chroot needs no copy of it
# then checks it by running a tiny foreign program (exit code 42).
# No systemd needed: the handler is written to binfmt_misc directly, from the package's own
# binfmt.d line. Idempotent: a correct handler is left alone; one without F is replaced.
# Usage: ci/emulation.sh [MACHINE...]   (as root, or with sudo; default: aarch64, or x86_64 on an
#                                        aarch64 host)
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "emulation.sh: needs root (or sudo) to register binfmt handlers" >&2; exit 1; }
  SUDO="sudo -n"
fi
say() { echo "emulation.sh: $*"; }
die() { echo "emulation.sh: $*" >&2; exit 1; }

host="$(uname -m)"
if [ "$#" -gt 0 ]; then machines=("$@"); elif [ "$host" = aarch64 ]; then machines=(x86_64); else machines=(aarch64); fi
BINFMT=/proc/sys/fs/binfmt_misc

# 1. Package: only when an interpreter is missing (a warm machine does not touch apt).
missing=0
for m in "${machines[@]}"; do
  [ -x "/usr/bin/qemu-$m-static" ] || missing=1
done
if [ "$missing" = 1 ]; then
  say "installing qemu-user-static"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null
else
  say "qemu-user-static already installed (reused)"
fi

# 2. binfmt_misc: mount it where the kernel interface lives, unless it already is.
if [ -e "$BINFMT/register" ]; then
  say "binfmt_misc already mounted at $BINFMT (reused)"
else
  say "mounting binfmt_misc at $BINFMT"
  $SUDO mount -t binfmt_misc binfmt_misc "$BINFMT" ||
    die "cannot mount binfmt_misc (a container needs --privileged, or the host must mount it)"
fi
[ "$(cat "$BINFMT/status")" = enabled ] || { say "enabling binfmt_misc"; echo 1 | $SUDO tee "$BINFMT/status" >/dev/null; }

# A minimal static ELF for MACHINE that exits with 42 (header, one program header, 3 instructions).
tiny_elf() {
  local hdr='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00'
  local ph='\x40\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00\x38\x00\x01\x00\x00\x00\x00\x00\x00\x00'
  local load='\x01\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00'
  local size='\x84\x00\x00\x00\x00\x00\x00\x00\x84\x00\x00\x00\x00\x00\x00\x00'  # 132 bytes in file and memory
  local align='\x00\x10\x00\x00\x00\x00\x00\x00'
  case "$1" in
    aarch64)  # movz x0,#42; movz x8,#93 (exit); svc #0
      printf '%b' "$hdr" '\x02\x00\xb7\x00\x01\x00\x00\x00\x78\x00\x40\x00\x00\x00\x00\x00' "$ph$load$size$align" \
        '\x40\x05\x80\xd2\xa8\x0b\x80\xd2\x01\x00\x00\xd4' ;;
    x86_64)  # mov edi,42; mov eax,60 (exit); syscall
      printf '%b' "$hdr" '\x02\x00\x3e\x00\x01\x00\x00\x00\x78\x00\x40\x00\x00\x00\x00\x00' "$ph$load$size$align" \
        '\xbf\x2a\x00\x00\x00\xb8\x3c\x00\x00\x00\x0f\x05' ;;
    *) return 1 ;;
  esac
}

# 3. One handler per machine, with F; 4. the check.
for m in "${machines[@]}"; do
  [ "$m" = "$host" ] && { say "$m is this host's machine: nothing to emulate"; continue; }
  name="qemu-$m"
  conf="/usr/lib/binfmt.d/$name.conf"
  [ -r "$conf" ] || die "$conf missing (qemu-user-static has no $m interpreter?)"
  line="$(grep -m1 "^:$name:" "$conf")" || die "$conf has no :$name: line"
  flags="${line##*:}"
  case "$flags" in *F*) ;; *) line="${line}F" ;; esac
  if [ -e "$BINFMT/$name" ]; then
    cur="$(cat "$BINFMT/$name")"
    if grep -qx enabled <<<"$cur" && grep -q '^flags: .*F' <<<"$cur"; then
      say "$name handler registered with F (reused)"
    else
      say "$name handler lacks the F flag or is disabled: replacing it"
      echo -1 | $SUDO tee "$BINFMT/$name" >/dev/null
    fi
  fi
  if [ ! -e "$BINFMT/$name" ]; then
    say "registering $name ($(awk -F: '{print $7}' <<<"$line"), flags ${line##*:})"
    printf '%s' "$line" | $SUDO tee "$BINFMT/register" >/dev/null
  fi
  grep -q '^flags: .*F' "$BINFMT/$name" || die "$name registered but without F: $(tr '\n' ' ' <"$BINFMT/$name")"
  probe="$(mktemp)"
  tiny_elf "$m" >"$probe" || { rm -f "$probe"; die "no test program for $m"; }
  chmod +x "$probe"
  set +e; "$probe"; rc=$?; set -e
  rm -f "$probe"
  [ "$rc" = 42 ] || die "check failed: an $m program exited $rc, not 42, under $name"
  say "check: an $m program runs under $name (exit 42)"
done
say "ready: emulating ${machines[*]} on $host"
