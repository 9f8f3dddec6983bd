"""Recipes: the schema, the line-tracking YAML loader, the digest, the checks against a source."""
