"""Routes of the hooks surface."""

urlpatterns = []
