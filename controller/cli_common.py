"""What every `optirack` command shares: the REST client from the options, and printing as text or JSON."""

from __future__ import annotations

import json

from controller.client import Client, find_token


def _client(args) -> Client:
    return Client(args.url, find_token(args.token, args.token_file))


def _print(args, data: dict, text: str) -> None:
    print(json.dumps(data, indent=1) if args.json else text)
