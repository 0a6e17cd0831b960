"""The GPU worker (lands with the container driver)."""


def main() -> int:
    print("optirack-worker: not yet")
    return 0
