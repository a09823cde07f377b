"""Fabric checks: parse `ibnetdiscover` output, compare it with the cabling plan, discover a
topology from it, and synthesize it from a plan for rehearsals and tests."""
