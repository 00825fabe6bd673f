def configured_sources(app, cluster):
    return []
