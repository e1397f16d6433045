#!/usr/bin/env bash
# stamp-commit.sh — run here before a device call: the device's copy of the tree has no .git, so the
# commit (and whether the tree differs from it) travels in .device-commit.
cd "$(dirname "$0")/.."
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.device-commit' || echo ' +uncommitted changes')" > .device-commit
