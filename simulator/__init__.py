"""optirack's cluster simulator: controller.core's own placement decisions over a simulated cluster."""
