"""The emulated rack: Mininet on Open vSwitch, built from a rack file."""
