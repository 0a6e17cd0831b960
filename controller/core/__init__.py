"""Pure logic: no Ryu, Docker or Mininet import; time, I/O and randomness are passed in."""
