"""Test and benchmark support that never ships: emulated hosts in Linux network namespaces
(:mod:`testbed.netns`). Neither installed by ``pip`` nor in the app bundle; the tests and the
benchmarks import it from the checkout."""
