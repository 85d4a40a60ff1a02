// Placeholder so the library has a source; delete when a real .cc lands here.
