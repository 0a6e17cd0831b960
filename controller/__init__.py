"""optirack's SDN controller: plain logic in core/, Ryu apps in apps/, southbound drivers in drivers/."""
