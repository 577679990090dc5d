"""Routes of the mcp surface."""

urlpatterns = []
