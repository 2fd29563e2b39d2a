"""`kit build`: recipes (:mod:`kit.build.recipe`) into squashfs images (:mod:`kit.build.image`).

Kept light on purpose: the command line imports the recipe tables at start-up
and the build machinery only when it builds.
"""
