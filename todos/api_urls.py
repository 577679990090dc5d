"""Routes of the api surface."""

urlpatterns = []
