"""`envbuild keygen`: make an Ed25519 key pair for signing tables (the command around envbuild.sign)."""

from __future__ import annotations

import json

from .sign import DEFAULT_KEY_DIR, DEFAULT_KEY_NAME, write_keypair


def add_arguments(p) -> None:
    p.add_argument("--out", default=DEFAULT_KEY_DIR,
                   help=f"directory for NAME.key (private, 0600) and NAME.pub.json (default: {DEFAULT_KEY_DIR})")
    p.add_argument("--name", default=DEFAULT_KEY_NAME, help=f"file name stem (default: {DEFAULT_KEY_NAME})")
    p.add_argument("--force", action="store_true", help="replace an existing key pair")
    p.add_argument("--json", action="store_true", help="print the key files and keyid as JSON")


def run(args) -> int:
    priv, pub_path, pub = write_keypair(args.out, args.name, args.force)
    if getattr(args, "json", False):
        print(json.dumps({"private_key": str(priv), "public_key": str(pub_path), "keyid": pub.keyid}, indent=2,
                         sort_keys=True))
        return 0
    print(f"private key: {priv} (keep it secret; `envbuild publish --key {priv}`; "
          f"{priv.parent / '.gitignore'} keeps git from adding it)")
    print(f"public key:  {pub_path}")
    print(f"keyid:       {pub.keyid}")
    return 0
