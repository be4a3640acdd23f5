# Sourced by run.sh and test.sh.
# Mesa's Vulkan (lavapipe, the adapter the GPU tests and a GPU-less host use)
# prints "XDG_RUNTIME_DIR is invalid" on every device open when this is
# unset, as it is under sudo and in CI; give it a private one.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
  export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/raid-xdg-$(id -u)"
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
fi
