// Lets a library folder build while it has no sources of its own yet.
