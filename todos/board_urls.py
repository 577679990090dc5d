"""Routes of the board surface."""

urlpatterns = []
