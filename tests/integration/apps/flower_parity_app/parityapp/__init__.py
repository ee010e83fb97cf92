"""parityapp: ServerApps that check geofl runs Flower apps as Flower does."""
