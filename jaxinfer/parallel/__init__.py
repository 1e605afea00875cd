"""Meshes, logical-axis rules, abstract weight leaves and multi-host start-up."""
