// Placeholder; delete when real code lands.
