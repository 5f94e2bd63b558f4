from django.urls import path

from payments import views

urlpatterns = [
    path("payments", views.create_payment),
]
